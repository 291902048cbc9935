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

_LAZY = {name: "tune.utils._device" for name in ("get_device", "get_dtype", "get_rank", "get_world_size")}

__all__ = [
    "TuneError",
    "get_device",
    "get_dtype",
    "get_logger",
    "get_rank",
    "get_world_size",
    "import_optional",
    "install_hint",
    "log_rank_zero",
    "read_json_file",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
