"""Test-wide hooks: tests marked ``gpu`` are skipped where there is no CUDA device."""

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (marked gpu); run `pytest -m gpu tests/gpu` on a machine with one")
