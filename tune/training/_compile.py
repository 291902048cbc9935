"""``torch.compile`` applied from outside the model: per transformer layer, and to the loss."""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tune.utils import get_logger, log_rank_zero

log = get_logger(name=__name__)


def _is_layer(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit()


def compile_model(
    model: nn.Module,
    verbose: bool = True,
    layer_condition: Callable[[str, nn.Module], bool] | None = None,
    backend: str | None = None,
    **compile_kwargs: Any,
) -> int:
    """Compiles each transformer layer in place with ``nn.Module.compile`` (or the whole model if none match).

    Compiling layer by layer keeps compile time flat in depth (all layers share one compiled graph) and leaves
    FSDP's per-layer hooks outside the compiled regions. Call it after activation checkpointing and before or
    after sharding, as the recipe prefers; names and state-dict keys do not change.

    Args:
        model (nn.Module): the model.
        verbose (bool): log (on rank 0) what is compiled. Default True.
        layer_condition (Callable[[str, nn.Module], bool] | None): which submodules to compile; default: each
            element of every ``layers`` ModuleList.
        backend (str | None): ``torch.compile`` backend; ``None`` uses the ``TORCH_COMPILE_BACKEND`` environment
            variable, else ``"inductor"``.
        **compile_kwargs: passed to ``torch.compile`` (``mode``, ``dynamic``, ...).

    Returns:
        int: the number of compiled modules (1 when the whole model was compiled).
    """
    backend = backend or _default_backend()
    condition = layer_condition or (lambda name, module: _is_layer(name))
    layers = [module for name, module in model.named_modules() if name and condition(name, module)]
    if not layers:
        log.info(f"compile_model: no layer matched, compiling the whole {type(model).__name__} instead.")
        layers = [model]
    if verbose:
        log_rank_zero(
            log, f"Compiling {len(layers)} module(s) of {type(model).__name__} with torch.compile ({backend})."
        )
    for layer in layers:
        layer.compile(backend=backend, **compile_kwargs)
    return len(layers)


def compile_loss(loss: nn.Module, verbose: bool = True, backend: str | None = None, **compile_kwargs: Any) -> nn.Module:
    """Compiles a loss in place and returns it.

    For ``tune.modules.loss`` chunked losses only the per-chunk computation is compiled: the chunk loop has a
    data-dependent number of tokens per chunk and is cheap in eager mode, while the fused projection +
    log-softmax is where compile saves memory and time.

    Args:
        loss (nn.Module): the loss module.
        verbose (bool): log (on rank 0) that the loss is compiled. Default True.
        backend (str | None): ``torch.compile`` backend; ``None`` as in :func:`compile_model`.
        **compile_kwargs: passed to ``torch.compile``.

    Returns:
        nn.Module: the same loss object.
    """
    backend = backend or _default_backend()
    if verbose:
        log_rank_zero(log, f"Compiling the loss {type(loss).__name__} with torch.compile ({backend}).")
    if hasattr(loss, "_chunk_loss"):
        loss._chunk_loss = torch.compile(loss._chunk_loss, backend=backend, **compile_kwargs)
    else:
        loss.compile(backend=backend, **compile_kwargs)
    return loss


def _default_backend() -> str:
    import os

    return os.environ.get("TORCH_COMPILE_BACKEND", "inductor")
