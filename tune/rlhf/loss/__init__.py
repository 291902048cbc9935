"""Losses of preference and reinforcement-learning fine-tuning (torchtune's ``torchtune.rlhf.loss``)."""

from tune.rlhf.loss._dpo import DPO_LOSS_TYPES, DPOLoss, RSOLoss, SimPOLoss
from tune.rlhf.loss._grpo import GRPO_LOSS_TYPES, GRPOLoss, GRPOLossOutput
from tune.rlhf.loss._ppo import PPOLoss

__all__ = [
    "DPO_LOSS_TYPES",
    "DPOLoss",
    "GRPO_LOSS_TYPES",
    "GRPOLoss",
    "GRPOLossOutput",
    "PPOLoss",
    "RSOLoss",
    "SimPOLoss",
]
