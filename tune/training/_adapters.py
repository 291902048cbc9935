"""What every LoRA recipe does with adapters, written once: the check that the model has them, which parameters
train, loading base and adapter weights into a LoRA model, and the checkpoint payload (the adapter in the PEFT
format, its config, and the merged model)."""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tune.modules.peft import (
    get_adapter_config,
    get_adapter_params,
    get_adapter_state_dict,
    get_merged_lora_ckpt,
    initialize_dora_magnitudes,
    set_trainable_params,
    validate_lora_state_dict_load,
)
from tune.training._distributed import load_from_full_model_state_dict
from tune.training.checkpointing import ADAPTER_CONFIG, ADAPTER_KEY, MODEL_KEY


def prepare_lora_model(
    model: nn.Module, *, full_recipe: str | None = None, model_converters: bool = True
) -> tuple[dict[str, nn.Parameter], dict]:
    """Makes the LoRA/DoRA adapters of ``model`` its only trainable parameters.

    Args:
        model (nn.Module): the model as built (and converted: a ``LoRAConverter`` adds adapters to any model).
        full_recipe (str | None): the recipe that trains a model without adapters, named in the error.
        model_converters (bool): whether the recipe takes ``model_converters`` (the error then suggests a
            ``LoRAConverter``).

    Returns:
        tuple[dict[str, nn.Parameter], dict]: the adapter parameters by name, and the adapter config
        (``r``, ``lora_alpha``, ... as built: :func:`tune.modules.peft.get_adapter_config`).

    Raises:
        ValueError: when the model has no LoRA/DoRA layer, or has parts a vision-language LoRA builder was asked to
            train in full (its ``trainable_parts``); a recipe reports it at ``model._component_``.
    """
    full_parts = [name for name, choice in getattr(model, "trainable_parts", {}).items() if choice == "full"]
    if full_parts:
        raise ValueError(
            f"builds a vision-language model whose {', '.join(full_parts)} part(s) train in full "
            f"({', '.join(f'{name}_trainable=full' for name in full_parts)}), but a LoRA recipe trains and saves "
            "adapters only. Set each to 'lora' or 'frozen', or train whole parts with the full builder and "
            + (full_recipe or "a full fine-tuning recipe")
        )
    adapter_params = get_adapter_params(model)
    if not adapter_params:
        fixes = ["Use a lora_*/qlora_* builder"]
        if model_converters:
            fixes.append("add tune.training.LoRAConverter to model_converters")
        if full_recipe:
            fixes.append(f"use {full_recipe}")
        raise ValueError(
            "builds a model without LoRA/DoRA layers: nothing for this recipe to train. "
            + (", ".join(fixes[:-1]) + " or " + fixes[-1] if len(fixes) > 1 else fixes[0])
        )
    set_trainable_params(model, adapter_params)
    return adapter_params, get_adapter_config(model)


def load_lora_state_dicts(
    model: nn.Module,
    base_state_dict: Mapping[str, Any] | None = None,
    adapter_state_dict: Mapping[str, Any] | None = None,
    *,
    device: torch.device | None = None,
    cpu_offload: bool = False,
) -> None:
    """Loads base weights, then saved adapter weights (either may be left out) into a LoRA model, checking that
    the keys match.

    The base checkpoint may lack exactly the adapter entries and the adapter checkpoint exactly the base ones;
    anything else is refused (:func:`tune.modules.peft.validate_lora_state_dict_load`). A model sharded with
    FSDP2 (``device`` given) loads with :func:`tune.training.load_from_full_model_state_dict`, each rank keeping
    its shards; DoRA magnitudes are not initialised here (they follow the loaded base weights: call
    ``initialize_dora_magnitudes`` between the two loads where it applies).

    Args:
        model (nn.Module): the LoRA model.
        base_state_dict (Mapping[str, Any] | None): the base model's weights, or ``None``.
        adapter_state_dict (Mapping[str, Any] | None): saved adapter weights, or ``None``.
        device (torch.device | None): for a sharded model, the device its shards live on; ``None`` for an
            unsharded model (``load_state_dict``).
        cpu_offload (bool): the sharded model keeps its shards on the CPU.

    Raises:
        ValueError: when a checkpoint's keys do not match the model's.
    """
    model_keys = set(model.state_dict())
    for loaded, state in (("base", base_state_dict), ("adapter", adapter_state_dict)):
        if state is None:
            continue
        validate_lora_state_dict_load(model, model_keys - set(state), set(state) - model_keys, loaded=loaded)
        if device is None:
            model.load_state_dict(state, strict=False)
        else:
            load_from_full_model_state_dict(model, state, device, strict=False, cpu_offload=cpu_offload)
        if loaded == "base":
            initialize_dora_magnitudes(model)  # DoRA's magnitude starts as the norm of the LOADED base weight


def lora_checkpoint_payload(
    model_state: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any], *, adapter_only: bool = False
) -> dict[str, Any]:
    """What a LoRA recipe hands its checkpointer: the adapter, its config and, unless ``adapter_only``, the merged
    model, which has the base architecture and loads without any LoRA code.

    Args:
        model_state (Mapping[str, torch.Tensor]): the full (gathered) state dict of the LoRA model; with
            ``adapter_only`` its adapter entries suffice.
        adapter_config (Mapping[str, Any]): :func:`tune.modules.peft.get_adapter_config` of the model.
        adapter_only (bool): leave the merged model out.

    Returns:
        dict[str, Any]: ``ADAPTER_KEY``, ``ADAPTER_CONFIG`` and, unless ``adapter_only``, ``MODEL_KEY``.
    """
    payload = {ADAPTER_KEY: get_adapter_state_dict(model_state), ADAPTER_CONFIG: dict(adapter_config)}
    if not adapter_only:
        payload[MODEL_KEY] = get_merged_lora_ckpt(
            model_state, rank=adapter_config["r"], alpha=adapter_config["lora_alpha"]
        )
    return payload
