"""A test that cannot import its reference implementation (TRL, transformers, PEFT) fails; other skips stay."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODULE_LEVEL = """
import pytest

pytest.importorskip("trl.a_path_trl_does_not_have")


def test_never_runs():
    pass
"""
IN_TEST = """
import pytest


def test_transformers_moved():
    pytest.importorskip("transformers.a_path_transformers_does_not_have")


def test_optional_package_still_skips():
    pytest.importorskip("a_package_no_one_installed")


def test_a_plain_test_passes():
    pass
"""


def test_a_missing_reference_fails_the_test_instead_of_skipping_it(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_module_level.py").write_text(MODULE_LEVEL)
    (tmp_path / "test_in_test.py").write_text(IN_TEST)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "-rA",
            "--continue-on-collection-errors",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert "1 failed, 1 passed, 1 skipped, 1 error" in summary, result.stdout
    assert "could not import 'trl.a_path_trl_does_not_have'" in result.stdout
    assert "install the dev extra with the pinned versions" in result.stdout
    assert "FAILED" in result.stdout and "test_transformers_moved" in result.stdout
    assert "SKIPPED" in result.stdout and "a_package_no_one_installed" in result.stdout
