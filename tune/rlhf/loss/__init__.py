"""Losses of preference and reinforcement-learning fine-tuning (torchtune's ``torchtune.rlhf.loss``)."""

from tune.rlhf.loss._dpo import DPO_LOSS_TYPES, DPOLoss, RSOLoss, SimPOLoss
from tune.rlhf.loss._grpo import GRPO_LOSS_TYPES, GRPOLoss, GRPOLossOutput
from tune.rlhf.loss._kto import KTO_LOSS_TYPES, KTOLoss, kto_kl_estimate
from tune.rlhf.loss._orpo import ORPOLoss, log1mexp
from tune.rlhf.loss._ppo import PPOLoss
from tune.rlhf.loss._reward import RewardMetrics, RewardModelLoss

__all__ = [
    "DPO_LOSS_TYPES",
    "DPOLoss",
    "GRPO_LOSS_TYPES",
    "GRPOLoss",
    "GRPOLossOutput",
    "KTO_LOSS_TYPES",
    "KTOLoss",
    "kto_kl_estimate",
    "log1mexp",
    "ORPOLoss",
    "PPOLoss",
    "RSOLoss",
    "RewardMetrics",
    "RewardModelLoss",
    "SimPOLoss",
]
