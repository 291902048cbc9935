"""Leaf helpers: logging, device and dtype, distributed rank, optional imports, the user-error type. Imports only
the standard library and torch.

The device helpers import torch on first use, not here: ``tune.config`` (and so ``tune ls``/``tune validate``)
imports this package for :class:`TuneError` and its logger and stays fast.
"""

import importlib
from typing import Any

from tune.utils._errors import TuneError
from tune.utils._files import read_json_file
from tune.utils._logging import get_logger, log_rank_zero
from tune.utils._optional import import_optional, install_hint

_LAZY = {
    name: "tune.utils._device"
    for name in (
        "DeviceSupport",
        "DEVICE_CHOICES",
        "DTYPE_CHOICES",
        "batch_to_device",
        "cpu_has_native_bf16",
        "device_problem",
        "get_device",
        "get_device_support",
        "get_dtype",
        "get_rank",
        "get_torch_device_namespace",
        "get_world_size",
        "get_world_size_and_rank",
        "torch_version_ge",
    )
}

__all__ = [
    "DEVICE_CHOICES",
    "DTYPE_CHOICES",
    "DeviceSupport",
    "TuneError",
    "batch_to_device",
    "cpu_has_native_bf16",
    "device_problem",
    "get_device",
    "get_device_support",
    "get_dtype",
    "get_logger",
    "get_rank",
    "get_torch_device_namespace",
    "get_world_size",
    "get_world_size_and_rank",
    "import_optional",
    "install_hint",
    "log_rank_zero",
    "read_json_file",
    "torch_version_ge",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
