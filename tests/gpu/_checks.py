"""Where the GPU tier runs its "GPU side", and how its comparisons are checked and recorded.

``TUNE_GPU_TIER_DEVICE`` (default ``cuda``) names the device; ``cpu`` dry-runs the tier on a machine without a GPU
(tests/conftest.py then does not skip it). ``TUNE_GPU_CHECK_RESULTS``, when set, names a JSON-lines file to which
each comparison appends ``{"test", "compared", "max_abs", "max_rel", "tolerance", "passed"}`` before asserting.
"""

import json
import math
import os

import pytest
import torch

DEVICE = os.environ.get("TUNE_GPU_TIER_DEVICE", "cuda")
ON_CPU = DEVICE == "cpu"


def skip_on_cpu(reason: str) -> None:
    """Skips the test in the CPU dry run only; ``reason`` says why it means nothing there."""
    if ON_CPU:
        pytest.skip(f"TUNE_GPU_TIER_DEVICE=cpu: {reason}")


def _test_name() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]


def record(compared: str, max_abs: float, max_rel: float, tolerance: str, passed: bool) -> None:
    """Appends one result line to the file ``TUNE_GPU_CHECK_RESULTS`` names (nothing when it is unset)."""
    path = os.environ.get("TUNE_GPU_CHECK_RESULTS")
    if not path:
        return
    line = {
        "test": _test_name(),
        "compared": compared,
        "max_abs": float(max_abs),
        "max_rel": float(max_rel),
        "tolerance": tolerance,
        "passed": bool(passed),
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def compare(compared: str, actual, expected, rel: float = 0.0, abs: float = 0.0, tolerance: str = "") -> str | None:
    """Checks ``|actual - expected| <= abs + rel * |expected|`` elementwise and records it, without asserting.

    Args:
        compared (str): what is compared with what, for the record.
        actual, expected: tensors (compared in float64 on the CPU) or floats.
        rel (float): relative tolerance. Default 0.
        abs (float): absolute tolerance. Default 0.
        tolerance (str): the tolerance in words; by default ``rel=..., abs=...``.

    Returns:
        str | None: None when within the tolerance, else what differed (for an assertion message).
    """
    actual = torch.as_tensor(actual).detach().cpu().double()
    expected = torch.as_tensor(expected).detach().cpu().double()
    assert actual.shape == expected.shape, (compared, actual.shape, expected.shape)
    diff = (actual - expected).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    max_rel = (diff / expected.abs().clamp_min(1e-30)).max().item() if diff.numel() else 0.0
    passed = bool((diff <= abs + rel * expected.abs()).all()) and math.isfinite(max_abs)
    tolerance = tolerance or f"rel={rel:.3g}, abs={abs:.3g}"
    record(compared, max_abs, max_rel, tolerance, passed)
    if passed:
        return None
    num_outside = int((diff > abs + rel * expected.abs()).sum())
    return (
        f"{compared}: max abs difference {max_abs:.3g}, max relative {max_rel:.3g}, {num_outside} of "
        f"{diff.numel()} outside {tolerance}"
    )


def check_close(compared: str, actual, expected, rel: float = 0.0, abs: float = 0.0, tolerance: str = "") -> None:
    """:func:`compare`, then asserts that it held."""
    failure = compare(compared, actual, expected, rel, abs, tolerance)
    assert failure is None, failure


def check_losses(compared: str, actual: dict[int, float], expected: dict[int, float], rel_per_step: float) -> None:
    """Checks per-step losses: step N's within ``N * rel_per_step`` relative (rounding that compounds per step)."""
    assert sorted(actual) == sorted(expected), (compared, sorted(actual), sorted(expected))
    steps = sorted(expected)
    rel = torch.tensor([step * rel_per_step for step in steps], dtype=torch.float64)
    act = torch.tensor([actual[s] for s in steps], dtype=torch.float64)
    exp = torch.tensor([expected[s] for s in steps], dtype=torch.float64)
    diff = (act - exp).abs()
    max_abs, max_rel = diff.max().item(), (diff / exp.abs()).max().item()
    passed = bool((diff <= rel * exp.abs()).all())
    tolerance = f"step N within N * {rel_per_step:.3g} relative"
    record(compared, max_abs, max_rel, tolerance, passed)
    assert passed, f"{compared}: {dict(zip(steps, act.tolist()))} vs {dict(zip(steps, exp.tolist()))}; {tolerance}"
