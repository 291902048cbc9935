"""torchtune's ``training.precision`` module path: dtype names, building in a dtype, checking parameter dtypes."""

import torch

from tune.training._precision import get_dtype, set_default_dtype, validate_expected_param_dtype

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
