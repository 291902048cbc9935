import os

import torch

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp64": torch.float64,
    "float64": torch.float64,
}


def get_rank() -> int:
    """Rank of this process in the default process group, or ``RANK`` from torchrun, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    """World size of the default process group, or ``WORLD_SIZE`` from torchrun, else 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_device(device: str | torch.device | None = None) -> torch.device:
    """Resolves a device name.

    Args:
        device (str | torch.device | None): ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` or ``None``/``"auto"``
            for the best available. A bare ``"cuda"`` under torchrun becomes ``cuda:LOCAL_RANK``.

    Returns:
        torch.device: the device.

    Raises:
        ValueError: if the device is not available on this machine.
    """
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device} was requested but CUDA is not available on this machine. "
                "Set `device=cpu` (or remove the key to pick the best available device)."
            )
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device} was requested but MPS is not available. Set `device=cpu`.")
    return device


def get_dtype(dtype: str | torch.dtype | None = None, device: torch.device | None = None) -> torch.dtype:
    """Resolves a dtype name (``fp32``, ``bf16``, ``fp16``, ...) to a ``torch.dtype``.

    Args:
        dtype (str | torch.dtype | None): the name; ``None`` means fp32.
        device (torch.device | None): when given, bf16 on a CUDA device without bf16 support is refused.

    Returns:
        torch.dtype: the dtype.

    Raises:
        ValueError: for an unknown name, or bf16 on a device that cannot run it.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        key = str(dtype).lower().removeprefix("torch.")
        if key not in _DTYPES:
            raise ValueError(f"Unknown dtype {dtype!r}. Use one of: {', '.join(sorted(set(_DTYPES)))}.")
        resolved = _DTYPES[key]
    if (
        resolved == torch.bfloat16
        and device is not None
        and device.type == "cuda"
        and not torch.cuda.is_bf16_supported()
    ):
        raise ValueError("dtype=bf16 was requested but this GPU does not support bfloat16. Use dtype=fp32.")
    return resolved
