"""Putting loaded weights into a model with errors that name the offending key."""

from collections.abc import Mapping

import torch
from torch import nn


def load_adapter_weights(model: nn.Module, adapter: Mapping[str, torch.Tensor]) -> None:
    """Copies adapter weights (from ``load_checkpoint()["adapter"]`` or ``load_adapter``) into a LoRA/DoRA model.

    The rest of the model is left alone, so the base weights can be loaded before or after.

    Args:
        model (nn.Module): a model built with LoRA/DoRA layers matching the adapter (same modules and rank).
        adapter (Mapping[str, torch.Tensor]): adapter weights in tune's keys.

    Raises:
        ValueError: naming a key the model lacks (different target modules) or a key whose shapes differ (a
            different rank or model size), with both shapes.
    """
    own = model.state_dict()
    unknown = [key for key in adapter if key not in own]
    if unknown:
        known = sorted(key for key in own if key.endswith(("lora_a.weight", "lora_b.weight", "magnitude")))
        raise ValueError(
            f"The adapter has {len(unknown)} keys the model lacks, e.g. {unknown[:3]}. The model's adapter keys "
            f"start with {known[:3]}. Build the model with the adapter's target modules (lora_attn_modules, "
            "apply_lora_to_mlp, apply_lora_to_output) and use_dora setting."
        )
    for key, value in adapter.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(
                f"Shape mismatch for {key!r}: {tuple(value.shape)} in the adapter, {tuple(own[key].shape)} in the "
                "model. Build the model with the adapter's lora_rank (the 'r' of adapter_config.json)."
            )
    model.load_state_dict(dict(adapter), strict=False)
