"""Layer dropout: skip a layer for a random subset of the batch during training (LayerDrop, LayerSkip)."""

import math
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import torch
from torch import nn


class LayerDropout(nn.Module):
    """Runs ``function`` on a random subset of the rows of its input; the other rows pass through unchanged.

    Each row along dimension 0 (a sequence of the batch) skips the layer with probability ``prob``, so the layer
    acts as the identity for it (LayerDrop, Fan et al., 2019, https://arxiv.org/abs/1909.11556). After each call
    ``inferred`` holds the fraction of rows that ran the layer. In eval mode (with ``disable_on_eval``) and with
    ``prob == 0`` every row runs it.

    Args:
        prob (float): probability that a row skips the layer. Default 0.0.
        dim (int | None): the dimension rows are dropped along; only 0 (the batch) is supported. Default 0.
        disable_on_eval (bool | None): run every row in eval mode. Default True.
        seed (int | None): seed of this module's own CPU generator, so the draws are reproducible and do not
            consume the global random state. Default None (unseeded).

    Raises:
        ValueError: if ``prob`` is outside ``[0, 1]`` or ``dim`` is not 0.
    """

    def __init__(
        self,
        prob: float = 0.0,
        dim: int | None = 0,
        disable_on_eval: bool | None = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"LayerDropout prob must be in [0, 1]; received {prob}.")
        if dim != 0:
            raise ValueError(f"LayerDropout drops rows along dim 0 (the batch) only; received dim={dim}.")
        self.prob = prob
        self.dim = dim
        self.disable_on_eval = disable_on_eval
        self.generator = torch.Generator(device="cpu")
        if seed is not None:
            self.generator.manual_seed(seed)
        self.inferred: float | torch.Tensor | None = None

    def forward(
        self, function: Callable[..., torch.Tensor] | nn.Module, input: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """Applies ``function(rows, *args, **kwargs)`` to the rows kept this call.

        Args:
            function (Callable | nn.Module): the layer; it must map its input to a tensor of the same shape.
            input (torch.Tensor): ``[b, ...]`` input.
            *args (Any): further positional arguments for ``function``.
            **kwargs (Any): keyword arguments for ``function``.

        Returns:
            torch.Tensor: ``[b, ...]``: the layer's output for the kept rows, the input for the skipped ones.
        """
        if self.prob == 0.0 or (self.disable_on_eval and not self.training):
            self.inferred = 1.0
            return function(input, *args, **kwargs)
        num_rows = input.shape[self.dim]
        skip = torch.bernoulli(torch.full((num_rows,), self.prob), generator=self.generator)  # [b], 1 = skip
        self.inferred = 1.0 - skip.mean()
        kept = (skip == 0).nonzero().flatten().to(input.device)
        out = input.clone()
        if kept.numel() > 0:
            out[kept] = function(input.index_select(self.dim, kept), *args, **kwargs)
        return out


class ModuleLayerDropoutWrapper(nn.Module):
    """Wraps ``module`` so that it runs under ``dropout``; otherwise it looks like ``module``.

    Attributes the wrapper does not have are read from the wrapped module, and its state dict
    keys are the wrapped module's (no ``module.`` level), so checkpoints load the same with or without the
    wrapper.

    Args:
        module (nn.Module): the layer.
        dropout (LayerDropout): decides which rows run it.
    """

    def __init__(self, module: nn.Module, dropout: LayerDropout) -> None:
        super().__init__()
        self.module = module
        self.dropout = dropout
        self._register_state_dict_hook(_drop_module_prefix)
        self._register_load_state_dict_pre_hook(_add_module_prefix)

    def forward(self, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Runs the wrapped module on the rows ``dropout`` keeps."""
        return self.dropout(self.module, input, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> Any:
        return self.module[key]


def _drop_module_prefix(wrapper: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "module.")]:
        state_dict[prefix + key[len(prefix + "module.") :]] = state_dict.pop(key)


def _add_module_prefix(state_dict: dict, prefix: str, *args: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "module.")]:
        state_dict[prefix + "module." + key[len(prefix) :]] = state_dict.pop(key)


class ScaleType(str, Enum):
    """How the layer-dropout probability grows from the first layer (0) to the last (``prob_max``)."""

    UNIFORM = "uniform"
    EXP = "exp"
    LINEAR = "linear"
    LOG = "log"
    SIN = "sin"
    SIGMOID = "sigmoid"
    STEP = "step"


def get_scale(scale_type: ScaleType, scale_period: int, val: int) -> float:
    """The factor in ``[0, 1]`` for position ``val`` of ``scale_period``: 0 at 0 (except uniform), 1 from the end on.

    Args:
        scale_type (ScaleType): the curve.
        scale_period (int): where the factor reaches 1.
        val (int): the position.

    Returns:
        float: the factor.
    """
    if scale_period == 0 or val >= scale_period:
        return 1.0
    fraction = val / scale_period
    curves = {
        ScaleType.UNIFORM: lambda: 1.0,
        ScaleType.EXP: lambda: 2.0**fraction - 1.0,
        ScaleType.LINEAR: lambda: fraction,
        ScaleType.LOG: lambda: math.log(val + 1, scale_period + 1),
        ScaleType.SIN: lambda: math.sin(0.5 * math.pi * fraction),
        ScaleType.SIGMOID: lambda: 1.0 / (1.0 + math.exp(-10.0 * (fraction - 0.5))),
        ScaleType.STEP: lambda: 0.0,  # off until the last layer
    }
    return min(max(curves[ScaleType(scale_type)](), 0.0), 1.0)


def _selected_layers(layers_str: str | None, num_layers: int) -> list[bool]:
    """``"::2"``, ``"1:3"`` or ``"0,4,5"`` (Python slice or index list) -> which of ``num_layers`` are chosen."""
    if layers_str is None:
        return [True] * num_layers
    if "," in layers_str:
        if ":" in layers_str:
            raise ValueError(f"layers_str is a slice or a list of indices, not both; received {layers_str!r}.")
        indices = [int(part) for part in layers_str.split(",")]
        if any(not 0 <= i < num_layers for i in indices):
            raise ValueError(f"layers_str {layers_str!r} names a layer outside 0..{num_layers - 1}.")
        return [i in indices for i in range(num_layers)]
    parts = [int(part) if part.strip() else None for part in layers_str.split(":")]
    if len(parts) == 1:
        return [i == parts[0] for i in range(num_layers)]
    chosen = set(range(num_layers)[slice(*parts)])
    return [i in chosen for i in range(num_layers)]


def prepare_layer_dropout(
    layers: nn.ModuleList | Iterable[nn.Module],
    prob_max: float = 0.0,
    prob_layer_scale: ScaleType | None = ScaleType.UNIFORM,
    layers_str: str | None = None,
    disable_on_eval: bool | None = True,
) -> None:
    """Wraps each layer of ``layers`` in place in a :class:`ModuleLayerDropoutWrapper`.

    Layer ``i`` of ``n`` gets the probability ``prob_max * get_scale(prob_layer_scale, n - 1, i)`` if
    ``layers_str`` selects it and 0 otherwise, and a :class:`LayerDropout` seeded with ``i`` (so the layers
    skip different rows). ``LINEAR`` is Progressive Layer Dropping (Zhang and He, 2020,
    https://arxiv.org/abs/2010.13369), ``EXP`` LayerSkip's (Elhoushi et al., 2024,
    https://arxiv.org/abs/2404.16710), ``layers_str="::2"`` LayerDrop's every other layer.

    Args:
        layers (nn.ModuleList | Iterable[nn.Module]): the layers (e.g. ``model.layers``), changed in place.
        prob_max (float): the largest probability, reached by the last layer. Default 0.0.
        prob_layer_scale (ScaleType | None): how the probability grows over the layers. Default uniform.
        layers_str (str | None): which layers get dropout, as a Python slice (``"::2"``) or indices
            (``"0,4,5"``). Default None (all).
        disable_on_eval (bool | None): run every row in eval mode. Default True.

    Raises:
        ValueError: for a ``prob_max`` outside ``[0, 1]`` or a bad ``layers_str``.
    """
    num_layers = len(layers)
    selected = _selected_layers(layers_str, num_layers)
    scale_type = ScaleType.UNIFORM if prob_layer_scale is None else prob_layer_scale
    for i in range(num_layers):
        prob = prob_max * get_scale(scale_type, num_layers - 1, i) if selected[i] else 0.0
        layers[i] = ModuleLayerDropoutWrapper(layers[i], LayerDropout(prob, disable_on_eval=disable_on_eval, seed=i))
