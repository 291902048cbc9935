"""Context managers and helpers around a model's KV caches (set up for generation, removed for training)."""

import contextlib
import warnings
from collections.abc import Generator

import torch
from torch import nn


def _cache_owners(model: nn.Module) -> list[nn.Module]:
    """The modules that hold a ``kv_cache`` slot (every attention layer)."""
    return [module for module in model.modules() if hasattr(module, "kv_cache") and hasattr(module, "cache_enabled")]


def delete_kv_caches(model: nn.Module) -> None:
    """Removes every KV cache of ``model`` and frees its memory, so the model runs as in training again.

    Args:
        model (nn.Module): a model with ``caches_are_setup`` (a ``TransformerDecoder``).

    Raises:
        ValueError: if the model has no caches set up.
    """
    if not model.caches_are_setup():
        raise ValueError("delete_kv_caches: the model has no KV caches; set them up with model.setup_caches(...).")
    for module in _cache_owners(model):
        module.kv_cache = None
        module.cache_enabled = True  # a model without caches has nothing to disable


@contextlib.contextmanager
def disable_kv_cache(model: nn.Module) -> Generator[None, None, None]:
    """Within the context, the model's attention ignores its KV caches (keeps them, neither reads nor appends).

    Useful to run a full forward pass (e.g. scoring a whole sequence) on a model set up for generation without
    deleting and reallocating its caches. The caches are used again on exit, with their content unchanged.

    Args:
        model (nn.Module): a model with ``caches_are_setup`` and ``caches_are_enabled``.

    Yields:
        None

    Raises:
        ValueError: if the model has no caches set up.
    """
    if not model.caches_are_setup():
        raise ValueError("disable_kv_cache: the model has no KV caches; set them up with model.setup_caches(...).")
    if not model.caches_are_enabled():
        warnings.warn(
            "disable_kv_cache: the model's KV caches are already disabled; this context changes nothing.", stacklevel=3
        )
    owners = _cache_owners(model)
    for module in owners:
        module.cache_enabled = False
    try:
        yield
    finally:
        for module in owners:
            module.cache_enabled = True


@contextlib.contextmanager
def local_kv_cache(
    model: nn.Module,
    *,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    encoder_max_seq_len: int | None = None,
    decoder_max_seq_len: int | None = None,
) -> Generator[None, None, None]:
    """Sets up KV caches for the duration of the context and deletes them on exit.

    Args:
        model (nn.Module): a model with ``setup_caches`` (a ``TransformerDecoder``) and no caches yet.
        batch_size (int): rows generated at once.
        device (torch.device): the default device while the caches are set up (tune's attention layers put
            their cache next to their weights).
        dtype (torch.dtype): the caches' dtype.
        encoder_max_seq_len (int | None): passed to ``setup_caches`` for models with an encoder; tune's text
            decoders take none. Default None.
        decoder_max_seq_len (int | None): cache capacity in tokens; None for the model's ``max_seq_len``.

    Yields:
        None

    Raises:
        ValueError: if the model already has caches.
    """
    if model.caches_are_setup():
        raise ValueError(
            "local_kv_cache: the model already has KV caches; delete them first with delete_kv_caches(model)."
        )
    kwargs = {"decoder_max_seq_len": decoder_max_seq_len}
    if encoder_max_seq_len is not None:
        kwargs["encoder_max_seq_len"] = encoder_max_seq_len
    with torch.device(device):
        model.setup_caches(batch_size, dtype, **kwargs)
    try:
        yield
    finally:
        delete_kv_caches(model)
