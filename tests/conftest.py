"""Test-wide hooks: tests marked ``gpu`` are skipped where there is no CUDA device (unless
``TUNE_GPU_TIER_DEVICE=cpu`` dry-runs them on the CPU, tests/gpu/_checks.py), and a test that cannot import a
reference implementation (TRL, transformers, PEFT) fails instead of skipping."""

import os
import re

import pytest

# The references the parity tests compare against: the dev extra installs them (pinned in .ci/constraints.txt).
# `pytest.importorskip` on one of them, at module level or in a test, reports a failure: a reference that moved
# an import path, or an environment without it, must not turn a parity check into a silent skip.
REFERENCES = ("trl", "transformers", "peft")
_COULD_NOT_IMPORT = re.compile(r"could not import '([\w.]+)'")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    if os.environ.get("TUNE_GPU_TIER_DEVICE", "cuda") == "cpu":
        return  # the dry run: each test runs its GPU side on the CPU
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (marked gpu); run `pytest -m gpu tests/gpu` on a machine with one")


def _fail_missing_reference(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    found = _COULD_NOT_IMPORT.search(reason)
    if found is None or found.group(1).split(".")[0] not in REFERENCES:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{reason.removeprefix('Skipped: ')}\nThis test compares against {found.group(1).split('.')[0]}, which must "
        "be importable: install the dev extra with the pinned versions (pip install -e '.[dev]' -c "
        ".ci/constraints.txt), or update the import path if the reference moved it."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    _fail_missing_reference(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _fail_missing_reference(outcome.get_result())
