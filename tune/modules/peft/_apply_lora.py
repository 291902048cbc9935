"""``apply_lora``: put LoRA / DoRA adapters on the ``nn.Linear`` layers of any model, chosen by name."""

import fnmatch
import re
from collections.abc import Sequence

import torch
from torch import nn

from tune.modules.peft._adapter_utils import get_adapter_params, set_trainable_params
from tune.modules.peft._dora import DoRALinear
from tune.modules.peft._lora import LoRALinear
from tune.utils import get_logger

_log = get_logger(name=__name__)
_MAX_NAMES_SHOWN = 40

Pattern = str | re.Pattern


def _suffixes(name: str) -> list[str]:
    # "model.layers.0.attn.q_proj" -> the name and every dotted tail of it, down to "q_proj".
    parts = name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def _matches(name: str, pattern: Pattern) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(name) is not None
    tails = _suffixes(name)
    if pattern in tails or any(fnmatch.fnmatchcase(tail, pattern) for tail in tails):
        return True
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def _adapter_like(
    linear: nn.Linear, rank: int, alpha: float, dropout: float, use_dora: bool, quantize_base: bool
) -> nn.Module:
    """Builds the adapter layer for ``linear`` on its device and dtype, taking over its weight and bias."""
    cls = DoRALinear if use_dora else LoRALinear
    weight = linear.weight
    # Built on meta so no throw-away random base weight is allocated; the real weights are then assigned.
    with torch.device("meta"):
        layer = cls(
            linear.in_features,
            linear.out_features,
            rank=rank,
            alpha=alpha,
            dropout=dropout,
            use_bias=linear.bias is not None,
            quantize_base=quantize_base,
        )
    base = {"weight": weight.detach()}
    if linear.bias is not None:
        base["bias"] = linear.bias.detach()
    layer.load_state_dict(base, strict=False, assign=True)
    for adapter in (layer.lora_a, layer.lora_b):
        adapter.to_empty(device=weight.device)
        adapter.to(dtype=weight.dtype)
    layer.initialize_parameters()
    if use_dora:
        layer.magnitude = nn.Parameter(torch.empty(linear.out_features, device=weight.device, dtype=weight.dtype))
        layer.initialize_dora_magnitude()
    layer.train(linear.training)
    return layer


def apply_lora(
    model: nn.Module,
    target_modules: Pattern | Sequence[Pattern],
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> nn.Module:
    """Replaces the matching ``nn.Linear`` layers of ``model`` by :class:`LoRALinear` (or :class:`DoRALinear`).

    Works on any ``nn.Module``, not only tune's models. A layer is matched by its qualified name (as in
    ``model.named_modules()``) when a pattern is:

    - the full name, or a dotted suffix of it: ``"q_proj"`` matches ``"layers.0.attn.q_proj"``;
    - a glob (``fnmatch``) over the full name or a dotted suffix: ``"layers.*.mlp.w1"``;
    - a regular expression that matches the full name: ``r"layers\\.[0-3]\\.attn\\.(q|v)_proj"``, or a
      compiled ``re.Pattern``.

    Only plain ``nn.Linear`` modules are replaced (subclasses may be used by their parent in other ways, e.g.
    ``nn.MultiheadAttention.out_proj``). The original weights are kept (assigned, not copied), adapters start
    as documented on :class:`LoRALinear`, and afterwards only adapter parameters are trainable: every other
    parameter of ``model`` is frozen.

    Args:
        model (nn.Module): the model, changed in place.
        target_modules (str | re.Pattern | Sequence[str | re.Pattern]): one pattern or several.
        rank (int): LoRA rank.
        alpha (float): LoRA alpha; the update is scaled by ``alpha / rank``.
        dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): use DoRA instead of LoRA. Default False.
        quantize_base (bool): store the base weights of the adapted layers in NF4 (QLoRA). Default False.

    Returns:
        nn.Module: ``model``, with adapters.

    Raises:
        ValueError: if no ``nn.Linear`` matches; the message lists the available ones.
        TypeError: if ``target_modules`` is empty or not strings / patterns.
    """
    patterns = [target_modules] if isinstance(target_modules, (str, re.Pattern)) else list(target_modules)
    if not patterns or not all(isinstance(p, (str, re.Pattern)) for p in patterns):
        raise TypeError(
            "target_modules must be a non-empty name pattern or list of them (e.g. ['q_proj', 'v_proj']), got "
            f"{target_modules!r}."
        )
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    chosen = [(name, m) for name, m in linears if any(_matches(name, p) for p in patterns)]
    if not chosen:
        names = [name for name, _ in linears]
        shown = ", ".join(names[:_MAX_NAMES_SHOWN]) + (" ..." if len(names) > _MAX_NAMES_SHOWN else "")
        raise ValueError(
            f"apply_lora: no nn.Linear layer of {type(model).__name__} matches target_modules={patterns!r}. "
            f"Its {len(names)} nn.Linear layer(s): {shown or '(none)'}. Use one of these names, a suffix such "
            "as 'q_proj', a glob such as 'layers.*.mlp.w1', or a regular expression."
        )
    if chosen[0][0] == "":
        raise TypeError(
            "apply_lora swaps layers inside a model, got a bare nn.Linear. Build LoRALinear / DoRALinear directly "
            "and load the linear's state dict into it."
        )
    for pattern in patterns:
        if not any(_matches(name, pattern) for name, _ in chosen):
            _log.warning(f"apply_lora: target pattern {pattern!r} matched no nn.Linear layer; it has no effect.")
    for name, linear in chosen:
        model.set_submodule(name, _adapter_like(linear, rank, alpha, dropout, use_dora, quantize_base))
    set_trainable_params(model, get_adapter_params(model))
    return model
