import itertools
import os
from enum import Enum
from typing import Any

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


# what a config's `dtype` may say, for messages
DTYPE_CHOICES = "one of fp32, bf16, fp16, fp64 (or float32, bfloat16, float16, float64)"
# what a config's `device` may say, for messages
DEVICE_CHOICES = "one of cpu, cuda, cuda:N (a GPU index), mps, xpu, npu, or auto (the best available)"


def device_problem(device: Any, check_present: bool = True) -> str | None:
    """What is wrong with a config's ``device`` value, or None when it names a device (present on this machine,
    when ``check_present``).

    Args:
        device (Any): the value: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"auto"``, ``None``, ...
        check_present (bool): also report an accelerator this machine does not have.

    Returns:
        str | None: a message that says what is allowed and how to fix it.
    """
    if device is None or device == "auto":
        return None
    if not isinstance(device, str):
        return f"must be {DEVICE_CHOICES}"
    try:
        parsed = torch.device(device)
        kind = parsed.type
    except RuntimeError:
        return f"must be {DEVICE_CHOICES}"
    if not check_present:
        return None
    if kind == "cuda" and not torch.cuda.is_available():
        return (
            "no CUDA device is visible on this machine (torch.cuda.is_available() is False); to run on the CPU "
            "set device=cpu (dtype=fp32 is the fast choice on most CPUs), or run where a GPU is visible"
        )
    if kind == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        return f"only {count} CUDA device(s) are visible on this machine: use cuda:0 to cuda:{count - 1}, or cuda"
    if kind == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine; to run on the CPU set device=cpu"
    accelerator = getattr(torch, kind, None)
    if kind in ("xpu", "npu") and not (accelerator is not None and accelerator.is_available()):
        return f"no {kind.upper()} device is visible on this machine; to run on the CPU set device=cpu"
    return None


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (x86: the ``avx512_bf16`` or ``amx_bf16`` flags; Arm: ``bf16``).

    Without it, bf16 matrix products are emulated and training in bf16 runs many times slower than in fp32. True
    when it cannot be told (no ``/proc/cpuinfo``): no warning is better than a wrong one.

    Args:
        cpuinfo (str | None): the text of ``/proc/cpuinfo``; read from the file when None.

    Returns:
        bool: whether bf16 runs natively (or it cannot be told).
    """
    text = cpuinfo
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return True
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


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
        ValueError: if the name is not a device, or the device is not available on this machine.
    """
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be {DEVICE_CHOICES}; got {device!r}") from None
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
            raise ValueError(f"dtype must be {DTYPE_CHOICES}; got {dtype!r}")
        resolved = _DTYPES[key]
    if (
        resolved == torch.bfloat16
        and device is not None
        and device.type == "cuda"
        and not torch.cuda.is_bf16_supported()
    ):
        raise ValueError("dtype=bf16 was requested but this GPU does not support bfloat16. Use dtype=fp32.")
    return resolved


def get_world_size_and_rank() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group (1 and 0 when not distributed), as in torchtune."""
    return get_world_size(), get_rank()


class DeviceSupport(Enum):
    """The accelerator kinds torchtune knows, each with its ``device_type``, a ``device_name`` to show users, and
    the ``communication_backend`` that ``torch.distributed`` uses on it."""

    CPU = ("cpu", "CPU", "gloo")
    CUDA = ("cuda", "GPU", "nccl")
    NPU = ("npu", "NPU", "hccl")
    XPU = ("xpu", "XPU", "ccl")

    def __init__(self, device_type: str, device_name: str, communication_backend: str) -> None:
        self.device_type = device_type
        self.device_name = device_name
        self.communication_backend = communication_backend

    @staticmethod
    def from_type(device_type: str) -> "DeviceSupport":
        """The member whose ``device_type`` is ``device_type``.

        Raises:
            ValueError: for a device type not listed here.
        """
        for member in DeviceSupport:
            if member.device_type == device_type:
                return member
        known = ", ".join(member.device_type for member in DeviceSupport)
        raise ValueError(f"Unknown device type {device_type!r}; known: {known}.")


def _available_device_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)  # present once the torch_npu extension is imported
    if npu is not None and npu.is_available():
        return "npu"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def get_device_support() -> DeviceSupport:
    """The best accelerator of this machine (CUDA, then NPU, then XPU, else CPU)."""
    return DeviceSupport.from_type(_available_device_type())


def get_torch_device_namespace() -> Any:
    """The ``torch`` submodule of this machine's accelerator (``torch.cuda``, ``torch.xpu``, ``torch.cpu``, ...),
    for calls such as ``get_torch_device_namespace().synchronize()``. Falls back to ``torch.cuda``."""
    return getattr(torch, get_device_support().device_type, torch.cuda)


def batch_to_device(batch: dict, device: torch.device) -> None:
    """Moves every tensor of ``batch`` (nested dicts included) to ``device``, in place.

    Args:
        batch (dict): names to tensors, to nested dicts of tensors, or to objects with ``.to(device)`` such as
            flex-attention block masks.
        device (torch.device): the device.

    Raises:
        ValueError: for a value that is neither a dict, a tensor nor a block mask.
    """
    for key, value in batch.items():
        if isinstance(value, dict):
            batch_to_device(value, device)
        elif isinstance(value, torch.Tensor) or type(value).__name__ == "BlockMask":
            batch[key] = value.to(device)
        else:
            raise ValueError(
                f"batch_to_device moves tensors and dicts of tensors; batch[{key!r}] is a {type(value).__name__}. "
                "Convert it to a tensor in the collate function, or keep it out of the batch."
            )


def _release(version: str) -> tuple[int, ...]:
    # "2.6.0.dev20241112+cu124" -> (2, 6, 0): the numeric release part only
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)


def torch_version_ge(version: str) -> bool:
    """Whether the installed torch is at least ``version``, comparing release numbers only.

    A pre-release or nightly counts as its release (``2.6.0.dev2024...`` is >= ``"2.6"``), as in torchtune.

    Args:
        version (str): e.g. ``"2.5"`` or ``"2.6.0"``.

    Returns:
        bool: True if ``torch.__version__`` is that version or later.
    """
    installed, wanted = _release(torch.__version__), _release(version)
    width = max(len(installed), len(wanted))
    return installed + (0,) * (width - len(installed)) >= wanted + (0,) * (width - len(wanted))
