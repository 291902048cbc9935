"""Dtype helpers: name resolution (re-exported from ``tune.utils``), building modules in a dtype, checking
parameter dtypes, and whether the machine trains in bfloat16."""

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from tune.utils import get_dtype

# torchtune's table of the precision names its configs accept
PRECISION_STR_TO_DTYPE: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}

__all__ = [
    "PRECISION_STR_TO_DTYPE",
    "get_dtype",
    "set_default_dtype",
    "validate_expected_param_dtype",
    "verify_bf16_support",
]


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


def verify_bf16_support() -> bool:
    """Whether this machine has an accelerator that trains in bfloat16: a CUDA GPU that supports it (Ampere or
    later, with NCCL 2.10 or later for distributed runs), an MPS device, or an XPU that supports it. A CPU-only
    machine gives False (PyTorch emulates bf16 on CPU, but slowly).

    Returns:
        bool: True if such an accelerator is present.
    """
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        if torch.distributed.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10):
            return True
    if torch.backends.mps.is_available() and torch.backends.mps.is_built():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available() and xpu.is_bf16_supported())
