"""Seeding every random number generator a training run touches."""

import os
import random

import numpy as np
import torch

from tune.utils import get_logger

__all__ = [
    "set_seed",
]

log = get_logger(name=__name__)

_MAX_SEED = 2**32 - 1  # numpy's limit
_DEBUG_MODES = (None, "default", "warn", "error")


def set_seed(seed: int | None = None, debug_mode: str | int | None = None) -> int:
    """Seeds Python's ``random``, NumPy and PyTorch (CPU and every GPU); optionally enforces determinism.

    Every rank of a distributed run gets the same seed, so modules initialised on each rank (LoRA adapters)
    agree; the data sampler shards the data, so ranks still see different samples.

    Args:
        seed (int | None): a value in ``[0, 2**32 - 1]``; ``None`` draws one (logged, and returned so the
            recipe can record it).
        debug_mode (str | int | None): PyTorch's deterministic debug mode. ``None`` leaves the setting alone;
            ``"default"``/0 allows nondeterministic kernels; ``"warn"``/1 warns on them; ``"error"``/2 raises on
            them. ``"warn"`` and ``"error"`` also make cuDNN and cuBLAS deterministic.

    Returns:
        int: the seed used.

    Raises:
        ValueError: for a seed out of range or an unknown ``debug_mode``.
    """
    if seed is None:
        seed = random.SystemRandom().randint(0, _MAX_SEED)
        log.info(f"No seed given: using seed={seed}")
    if not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {_MAX_SEED}] (or null to draw one); received {seed!r}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and all CUDA generators
    if debug_mode is not None:
        _set_debug_mode(debug_mode)
    return seed


def _set_debug_mode(debug_mode: str | int) -> None:
    names = {0: "default", 1: "warn", 2: "error"}
    mode = names.get(debug_mode, debug_mode) if isinstance(debug_mode, int) else debug_mode
    if mode not in _DEBUG_MODES[1:]:
        raise ValueError(f"debug_mode must be one of 'default', 'warn', 'error' (or 0, 1, 2); received {debug_mode!r}.")
    torch.set_deterministic_debug_mode(mode)
    deterministic = mode != "default"
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic (CUDA docs, "Reproducibility")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
