"""Losses of preference and reinforcement-learning fine-tuning (torchtune's ``torchtune.rlhf.loss``)."""

from tune.rlhf.loss._dpo import DPO_LOSS_TYPES, DPOLoss, RSOLoss, SimPOLoss

__all__ = ["DPO_LOSS_TYPES", "DPOLoss", "RSOLoss", "SimPOLoss"]
