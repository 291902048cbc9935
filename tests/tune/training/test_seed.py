"""set_seed: every generator reproducible, seed drawn when missing, deterministic debug mode."""

import random

import numpy as np
import pytest
import torch

from tune.training import set_seed


def _draw():
    return random.random(), np.random.rand(), torch.rand(1).item()


def test_same_seed_same_numbers_in_python_numpy_and_torch():
    assert set_seed(123) == 123
    first = _draw()
    set_seed(123)
    assert _draw() == first
    set_seed(124)
    assert all(a != b for a, b in zip(_draw(), first))


def test_no_seed_draws_and_returns_one():
    seed = set_seed(None)
    assert isinstance(seed, int) and 0 <= seed < 2**32
    first = _draw()
    set_seed(seed)
    assert _draw() == first


def test_invalid_seed_and_mode_are_refused():
    with pytest.raises(ValueError, match="seed must be an int"):
        set_seed(-1)
    with pytest.raises(ValueError, match="debug_mode"):
        set_seed(0, debug_mode="loud")


def test_debug_mode_sets_torch_determinism():
    try:
        set_seed(0, debug_mode="warn")
        assert torch.get_deterministic_debug_mode() == 1
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        set_seed(0, debug_mode="default")
    assert torch.get_deterministic_debug_mode() == 0
