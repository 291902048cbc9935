"""Adapter utilities: find, freeze, save, merge, disable and load-check the adapters of any model."""

import contextlib
from collections.abc import Generator, Iterable, Mapping
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn

from tune.modules.peft._lora_experts import is_expert_adapter_key, merge_lora_experts_state_dict
from tune.modules.peft._nf4 import dequantize, is_nf4_tensor

# The attention projections LoRA builders accept in `lora_attn_modules`.
LORA_ATTN_MODULES = Literal["q_proj", "k_proj", "v_proj", "output_proj"]

_ADAPTER_SUFFIXES = (".lora_a.weight", ".lora_b.weight", ".magnitude")
_MAX_KEYS_SHOWN = 10


@runtime_checkable
class AdapterModule(Protocol):
    """A module holding trainable adapter parameters next to frozen base ones (e.g. :class:`LoRALinear`)."""

    def adapter_params(self) -> list[str]:
        """Returns the names, relative to the module, of its adapter parameters."""
        ...


def get_adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """Collects the adapter parameters of every adapter module in ``model``.

    Args:
        model (nn.Module): any model, possibly containing :class:`LoRALinear` / :class:`DoRALinear` layers.

    Returns:
        dict[str, nn.Parameter]: fully qualified parameter name -> parameter, e.g.
        ``"layers.0.attn.q_proj.lora_a.weight"``. Empty when the model has no adapters.
    """
    params: dict[str, nn.Parameter] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, AdapterModule):
            continue
        for name in module.adapter_params():
            full_name = f"{module_name}.{name}" if module_name else name
            params[full_name] = module.get_parameter(name)
    return params


def set_trainable_params(model: nn.Module, adapter_params: Mapping[str, nn.Parameter] | Iterable[str]) -> None:
    """Makes exactly the named parameters trainable and freezes every other one.

    Args:
        model (nn.Module): the model.
        adapter_params (Mapping[str, nn.Parameter] | Iterable[str]): the output of :func:`get_adapter_params`, or
            fully qualified parameter names.

    Raises:
        ValueError: if a name is not a parameter of ``model``.
    """
    trainable = set(adapter_params.keys() if isinstance(adapter_params, Mapping) else adapter_params)
    names = dict(model.named_parameters())
    unknown = sorted(trainable - names.keys())
    if unknown:
        raise ValueError(
            f"set_trainable_params got {len(unknown)} name(s) that are not parameters of the model: "
            f"{_show(unknown)}. Pass the dict returned by get_adapter_params(model)."
        )
    for name, param in names.items():
        param.requires_grad_(name in trainable)


def is_adapter_key(key: str) -> bool:
    """Tells whether a state-dict key belongs to a LoRA/DoRA adapter (``lora_a``, ``lora_b`` or ``magnitude``), or
    to the LoRA of stacked experts (``...experts.gate_proj_lora_a``: :class:`LoRASwiGLUExperts`).

    Args:
        key (str): a state-dict key.

    Returns:
        bool: True for adapter keys.
    """
    return (
        key.endswith(_ADAPTER_SUFFIXES)
        or key in ("lora_a.weight", "lora_b.weight", "magnitude")
        or is_expert_adapter_key(key)
    )


def get_adapter_state_dict(state_dict: Mapping[str, torch.Tensor], device: str | None = "cpu") -> dict:
    """Keeps only the adapter entries of a state dict.

    Args:
        state_dict (Mapping[str, torch.Tensor]): a full model state dict.
        device (str | None): where to move the kept tensors; None leaves them in place. Default "cpu".

    Returns:
        dict[str, torch.Tensor]: the ``lora_a`` / ``lora_b`` / ``magnitude`` entries.
    """
    return {k: (v.to(device) if device is not None else v) for k, v in state_dict.items() if is_adapter_key(k)}


def get_merged_lora_ckpt(state_dict: Mapping[str, torch.Tensor], rank: int, alpha: float) -> dict:
    """Folds LoRA / DoRA adapters into their base weights, giving a state dict with the base model's keys.

    Expert adapters (``<experts>.<proj>_lora_a``) are merged per expert (:func:`merge_lora_experts_state_dict`).
    For each ``<prefix>.lora_a.weight`` the base ``<prefix>.weight`` becomes ``W + (alpha / rank) B A``; when
    ``<prefix>.magnitude`` exists (DoRA) it becomes ``(m / ||W + (alpha/rank) B A||_c)[:, None] * (W + ...)``.
    NF4 base weights are dequantised. The math runs in (at least) fp32 and each result takes its base weight's
    dtype. The input is not modified.

    Args:
        state_dict (Mapping[str, torch.Tensor]): a LoRA/DoRA model's state dict.
        rank (int): the adapters' rank (checked against the ``lora_a`` shapes).
        alpha (float): the adapters' alpha.

    Returns:
        dict[str, torch.Tensor]: plain tensors keyed like the base model (no adapter keys).

    Raises:
        ValueError: if an adapter's rank differs from ``rank``, or its base weight or ``lora_b`` is missing.
    """
    # the expert adapters (3-D, one update per expert) first: their merge gives plain expert weights
    state_dict = merge_lora_experts_state_dict(state_dict, alpha, rank)
    merged = {k: v for k, v in state_dict.items() if not is_adapter_key(k)}
    prefixes = [k[: -len("lora_a.weight")] for k in state_dict if k.endswith("lora_a.weight")]
    for prefix in prefixes:
        lora_a = state_dict[prefix + "lora_a.weight"]
        lora_b = state_dict.get(prefix + "lora_b.weight")
        base_key = prefix + "weight"
        if lora_b is None or base_key not in state_dict:
            raise ValueError(
                f"Adapter '{prefix}lora_a.weight' has no matching '{prefix}lora_b.weight' or '{base_key}' in the "
                "state dict. Pass the full model state dict (model.state_dict()), not the adapter-only one."
            )
        if lora_a.shape[0] != rank:
            raise ValueError(
                f"Adapter '{prefix}lora_a.weight' has rank {lora_a.shape[0]} but rank={rank} was given. Pass the "
                "lora_rank the model was built with."
            )
        base = dequantize(state_dict[base_key])
        # The merge math runs in at least fp32 so bf16 weights lose precision only once, in the final cast.
        compute = torch.promote_types(base.dtype, torch.float32)
        adapted = base.to(compute) + (alpha / rank) * (lora_b.to(compute) @ lora_a.to(compute))
        magnitude = state_dict.get(prefix + "magnitude")
        if magnitude is not None:
            # The norm uses the same adapted weight, as DoRALinear.forward and PEFT's DoRA merge do.
            norm = torch.linalg.norm(adapted, dim=1)
            adapted = (magnitude.to(compute) / norm).view(-1, 1) * adapted
        merged[base_key] = adapted.to(base.dtype)
    # Quantised weights outside adapter layers are dequantised too, so the result saves with safetensors.
    return {k: (dequantize(v) if is_nf4_tensor(v) else v) for k, v in merged.items()}


@torch.no_grad()
def merge_lora_weights(model: nn.Module) -> nn.Module:
    """Replaces every :class:`LoRALinear` / :class:`DoRALinear` in ``model`` by an ``nn.Linear`` with the merged
    weight, in place, so the model has its base architecture and state-dict keys again.

    Args:
        model (nn.Module): a model with adapter layers (or one; a bare adapter layer cannot be replaced in place,
            use its ``merged_weight()``).

    Returns:
        nn.Module: ``model``, now without adapters. Merged layers' parameters are frozen like the base was.

    Raises:
        TypeError: if ``model`` itself is an adapter layer.
    """
    if isinstance(model, AdapterModule) and hasattr(model, "merged_weight"):
        raise TypeError(
            f"merge_lora_weights replaces adapter layers inside a model, got a bare {type(model).__name__}. "
            "Use layer.merged_weight() and build an nn.Linear from it."
        )
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, AdapterModule) and hasattr(m, "merged_weight")]
    for name, layer in targets:
        weight = layer.merged_weight().detach()
        linear = nn.Linear(layer.in_dim, layer.out_dim, bias=layer.bias is not None, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if layer.bias is not None:
            linear.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)
        linear.train(layer.training)
        model.set_submodule(name, linear)
    return model


@contextlib.contextmanager
def disable_adapter(model: nn.Module) -> Generator[None, None, None]:
    """Runs the block with every adapter layer of ``model`` computing its base output only.

    Useful for the reference model of preference losses (DPO) without a second copy of the weights. Restores
    each layer's previous ``disabled`` value on exit, also on error.

    Args:
        model (nn.Module): a model with adapter layers.

    Yields:
        None

    Raises:
        ValueError: if ``model`` has no adapter layer with a ``disabled`` switch.
    """
    layers = [m for m in model.modules() if isinstance(m, AdapterModule) and hasattr(m, "disabled")]
    if not layers:
        raise ValueError(
            f"disable_adapter found no adapter layer (LoRALinear / DoRALinear) in {type(model).__name__}; there is "
            "nothing to disable. Build the model with LoRA (a lora_* builder or apply_lora) first."
        )
    previous = [m.disabled for m in layers]
    try:
        for m in layers:
            m.disabled = True
        yield
    finally:
        for m, value in zip(layers, previous):
            m.disabled = value


def validate_lora_state_dict_load(
    model: nn.Module,
    missing_keys: Iterable[str],
    unexpected_keys: Iterable[str],
    *,
    loaded: Literal["base", "adapter"] = "base",
) -> None:
    """Checks the result of ``model.load_state_dict(sd, strict=False)`` on a LoRA model.

    Loading base weights (``loaded="base"``) may leave exactly the adapter parameters missing; loading
    adapter weights (``loaded="adapter"``) may leave exactly the base entries missing. Anything else, or any
    unexpected key, means the checkpoint and the model do not match.

    Args:
        model (nn.Module): the LoRA model that was loaded into.
        missing_keys (Iterable[str]): ``missing_keys`` returned by ``load_state_dict``.
        unexpected_keys (Iterable[str]): ``unexpected_keys`` returned by ``load_state_dict``.
        loaded (str): "base" or "adapter": what the state dict held. Default "base".

    Raises:
        ValueError: listing the keys that should not be missing, and the unexpected ones.
    """
    if loaded not in ("base", "adapter"):
        raise ValueError(f"loaded must be 'base' or 'adapter', got {loaded!r}.")
    adapter_keys = {k for k in model.state_dict() if is_adapter_key(k)}
    missing = set(missing_keys)
    bad_missing = sorted(missing - adapter_keys if loaded == "base" else missing & adapter_keys)
    unexpected = sorted(unexpected_keys)
    problems = []
    if bad_missing:
        kind = "base" if loaded == "base" else "adapter"
        problems.append(f"{len(bad_missing)} missing {kind} key(s): {_show(bad_missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_show(unexpected)}")
    if problems:
        raise ValueError(
            f"Loading {loaded} weights into {type(model).__name__} did not match: " + "; ".join(problems) + ". "
            "Check that the checkpoint belongs to this model (same family, size and key format) and that the "
            "LoRA settings (target modules, DoRA or not) are the ones it was trained with."
        )


def get_lora_module_names(
    lora_attn_modules: list[LORA_ATTN_MODULES], apply_lora_to_mlp: bool, apply_lora_to_output: bool
) -> list[str]:
    """The names of the modules a LoRA builder adapts, given the builder's three LoRA arguments.

    Args:
        lora_attn_modules (list[str]): attention projections with adapters (``q_proj``, ``k_proj``, ``v_proj``,
            ``output_proj``).
        apply_lora_to_mlp (bool): the feed-forward projections ``w1``, ``w2``, ``w3`` get adapters too.
        apply_lora_to_output (bool): the output projection ``output`` gets one too.

    Returns:
        list[str]: the module names, attention projections first (a new list; the argument is not changed).
    """
    names = list(lora_attn_modules)
    if apply_lora_to_mlp:
        names += ["w1", "w2", "w3"]
    if apply_lora_to_output:
        names.append("output")
    return names


def validate_missing_and_unexpected_for_lora(
    lora_attn_modules: list[LORA_ATTN_MODULES],
    apply_lora_to_mlp: bool,
    apply_lora_to_output: bool,
    base_missing: list[str] | None = None,
    base_unexpected: list[str] | None = None,
    lora_missing: list[str] | None = None,
    lora_unexpected: list[str] | None = None,
) -> None:
    """Checks the keys ``load_state_dict(strict=False)`` reported when loading a LoRA model in two parts.

    Loading the base weights may leave only adapter parameters (``<module>.lora_*`` or ``<module>.magnitude`` of
    an adapted module) missing; loading the adapter weights may leave only the other parameters missing; neither
    load may bring unexpected keys. The adapted modules are named by the builder's LoRA arguments; to check
    against the model itself instead, use :func:`validate_lora_state_dict_load`.

    Args:
        lora_attn_modules (list[str]): attention projections with adapters.
        apply_lora_to_mlp (bool): whether the feed-forward projections have adapters.
        apply_lora_to_output (bool): whether the output projection has one.
        base_missing (list[str] | None): missing keys of the base-weight load.
        base_unexpected (list[str] | None): unexpected keys of the base-weight load.
        lora_missing (list[str] | None): missing keys of the adapter load.
        lora_unexpected (list[str] | None): unexpected keys of the adapter load.

    Raises:
        ValueError: naming the first key that should not be missing, or the unexpected keys.
    """
    modules = get_lora_module_names(lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output)

    def is_lora_key(key: str) -> bool:
        return any(f"{name}.lora" in key or f"{name}.magnitude" in key for name in modules)

    for key in base_missing or []:
        if not is_lora_key(key):
            raise ValueError(f"the base checkpoint has no entry for the non-LoRA parameter {key!r}.")
    if base_unexpected:
        raise ValueError(f"unexpected keys loading the base model: {_show(sorted(base_unexpected))}.")
    for key in lora_missing or []:
        if is_lora_key(key):
            raise ValueError(f"the adapter checkpoint has no entry for the LoRA parameter {key!r}.")
    if lora_unexpected:
        raise ValueError(f"unexpected keys loading the adapter: {_show(sorted(lora_unexpected))}.")


def _show(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_KEYS_SHOWN])
    return shown + (f", ... ({len(keys) - _MAX_KEYS_SHOWN} more)" if len(keys) > _MAX_KEYS_SHOWN else "")


def get_adapter_config(model: nn.Module) -> dict[str, float]:
    """The LoRA hyperparameters of ``model`` as built, under the Hugging Face PEFT ``adapter_config.json`` names.

    A builder may default them, so they are read from the layers: ``r`` (rank), ``lora_alpha`` and
    ``lora_dropout`` of the first :class:`LoRALinear`/:class:`DoRALinear` (every adapter layer a builder makes
    shares them).

    Returns:
        dict[str, float]: ``{"r": ..., "lora_alpha": ..., "lora_dropout": ...}``.

    Raises:
        ValueError: when the model has no LoRA/DoRA layer.
    """
    from tune.modules.peft._dora import DoRALinear
    from tune.modules.peft._lora import LoRALinear
    from tune.modules.peft._lora_experts import LoRASwiGLUExperts

    layer = next((m for m in model.modules() if isinstance(m, (LoRALinear, DoRALinear))), None)
    if layer is None:  # adapters on stacked experts only: they have no dropout
        experts = next((m for m in model.modules() if isinstance(m, LoRASwiGLUExperts)), None)
        if experts is not None:
            return {"r": experts.rank, "lora_alpha": experts.alpha, "lora_dropout": 0.0}
        raise ValueError("the model has no LoRA/DoRA layers")
    dropout = layer.dropout.p if isinstance(layer.dropout, nn.Dropout) else 0.0
    return {"r": layer.rank, "lora_alpha": layer.alpha, "lora_dropout": dropout}


def initialize_dora_magnitudes(model: nn.Module) -> None:
    """Sets the magnitude of every :class:`DoRALinear` of ``model`` to the norm of its base weight, as DoRA starts
    (call it after the base weights are loaded)."""
    from tune.modules.peft._dora import DoRALinear

    for module in model.modules():
        if isinstance(module, DoRALinear):
            module.initialize_dora_magnitude()
