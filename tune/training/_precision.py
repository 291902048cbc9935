"""Dtype helpers: name resolution (re-exported from ``tune.utils``) and building modules in a dtype."""

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from tune.utils import get_dtype

__all__ = ["get_dtype", "set_default_dtype", "validate_expected_param_dtype"]


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Within the block, new floating-point tensors (and so module parameters) are created in ``dtype``.

    Building a model under ``set_default_dtype(torch.bfloat16)`` allocates bf16 weights directly, instead of
    fp32 weights that are then cast (which briefly needs both).

    Args:
        dtype (torch.dtype): the floating-point dtype to use inside the block.

    Yields:
        None
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def validate_expected_param_dtype(
    named_params: Iterable[tuple[str, nn.Parameter]],
    dtype: torch.dtype,
    exclude_param_names: list[str] | None = None,
) -> None:
    """Checks that every parameter has ``dtype``.

    Args:
        named_params (Iterable[tuple[str, nn.Parameter]]): e.g. ``model.named_parameters()``.
        dtype (torch.dtype): the expected dtype.
        exclude_param_names (list[str] | None): parameters whose name contains any of these strings are not
            checked (e.g. ``["scales"]`` for quantisation scales kept in fp32). Default None: check all.

    Raises:
        ValueError: naming the first parameters with another dtype.
    """
    excluded = exclude_param_names or []
    wrong = [
        f"{name} ({param.dtype})"
        for name, param in named_params
        if param.dtype != dtype and not any(part in name for part in excluded)
    ]
    if wrong:
        raise ValueError(
            f"Expected every parameter in {dtype}, but {len(wrong)} are not: {', '.join(wrong[:5])}"
            f"{'...' if len(wrong) > 5 else ''}. Build the model under `set_default_dtype({dtype})`."
        )
