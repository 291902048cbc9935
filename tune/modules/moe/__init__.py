"""Mixture-of-experts building blocks: a top-k router, stacked SwiGLU experts, the MoE block and its
load-balancing loss (model-agnostic; the Qwen3-MoE family assembles them)."""

from tune.modules.moe._experts import SwiGLUExperts, grouped_linear
from tune.modules.moe._moe import (
    MoE,
    load_balancing_loss,
    moe_aux_loss,
    moe_layer_pattern,
    moe_layers,
    tokens_per_expert,
)
from tune.modules.moe._router import TopKRouter

__all__ = [
    "MoE",
    "SwiGLUExperts",
    "TopKRouter",
    "grouped_linear",
    "load_balancing_loss",
    "moe_aux_loss",
    "moe_layer_pattern",
    "moe_layers",
    "tokens_per_expert",
]
