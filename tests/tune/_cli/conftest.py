import os
import subprocess
import sys
from pathlib import Path

import pytest

from tune import plugins
from tune._cli.main import main
from tune.config import _discovery

REPO = Path(__file__).resolve().parents[3]
ASSETS = REPO / "tests" / "assets"
SHIPPED = ASSETS / "cli" / "shipped"
PLUGINS = ASSETS / "plugins"


@pytest.fixture
def shipped(monkeypatch):
    """Discovery sees tests/assets/cli/shipped as the shipped recipes and configs."""
    monkeypatch.setattr(_discovery, "shipped_dirs", lambda: (SHIPPED / "recipes", SHIPPED / "configs"))
    plugins._reset_for_tests()
    return SHIPPED


@pytest.fixture
def tune(capsys, monkeypatch):
    """Runs `tune ARGS` in this process; returns (exit status, stdout, stderr)."""
    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # instantiate may append the working directory

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's --help and usage errors
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def tune_subprocess():
    """Runs `python -m tune._cli ARGS` in a fresh process with this checkout (and ``paths``) importable."""

    def run(*args: str, paths: tuple[Path, ...] = (), cwd: Path | None = None, timeout: float = 120):
        env = {k: v for k, v in os.environ.items() if k != "TUNE_DEBUG"}
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(REPO)])
        cmd = [sys.executable, "-m", "tune._cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or REPO)

    return run
