"""Leaf helpers: logging, device and dtype, distributed rank, optional imports. Imports only stdlib and torch."""

from tune.utils._device import get_device, get_dtype, get_rank, get_world_size
from tune.utils._logging import get_logger, log_rank_zero
from tune.utils._optional import import_optional

__all__ = [
    "get_device",
    "get_dtype",
    "get_logger",
    "get_rank",
    "get_world_size",
    "import_optional",
    "log_rank_zero",
]
