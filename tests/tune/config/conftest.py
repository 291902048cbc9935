import sys
from pathlib import Path

import pytest

from tune import plugins
from tune.config import _discovery

ASSETS = Path(__file__).resolve().parents[2] / "assets"
SHIPPED = ASSETS / "cli" / "shipped"


@pytest.fixture
def shipped(monkeypatch):
    """Discovery sees the fixture recipes and configs of tests/assets/cli/shipped as the shipped ones."""
    monkeypatch.setattr(_discovery, "shipped_dirs", lambda: (SHIPPED / "recipes", SHIPPED / "configs"))
    return SHIPPED


@pytest.fixture
def demo_plugin(monkeypatch):
    """The fixture distributions of tests/assets/plugins on sys.path: one working plugin, one broken."""
    for name in ("good", "broken"):
        monkeypatch.syspath_prepend(str(ASSETS / "plugins" / name))
    plugins._reset_for_tests()
    yield
    plugins._reset_for_tests()
    for module in [m for m in sys.modules if m.startswith(("tune_demo_plugin", "tune_broken_plugin"))]:
        del sys.modules[module]
