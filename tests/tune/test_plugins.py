"""tune/plugins.py: third-party extensions through the `tune.plugins` entry-point group.

The fixture distributions in tests/assets/plugins are real ones (a package plus a `*.dist-info` directory with
METADATA and entry_points.txt): put on sys.path they are found by importlib.metadata exactly as an installed
package would be.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tune import plugins
from tune.config import instantiate

REPO = Path(__file__).resolve().parents[2]
GOOD = REPO / "tests" / "assets" / "plugins" / "good"
BROKEN = REPO / "tests" / "assets" / "plugins" / "broken"


def _forget_fixture_modules() -> None:
    for name in [m for m in sys.modules if m.startswith(("tune_demo_plugin", "tune_broken_plugin"))]:
        del sys.modules[name]


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.syspath_prepend(str(GOOD))
    monkeypatch.syspath_prepend(str(BROKEN))
    plugins._reset_for_tests()
    _forget_fixture_modules()  # other tests in this process may have loaded them
    yield
    plugins._reset_for_tests()
    _forget_fixture_modules()


def test_entry_points_are_listed_lower_cased_without_importing_anything(installed):
    names = set(plugins.entry_points())
    assert {"demo_recipe", "demo_family", "demo_repeat", "broken_thing"} <= names
    assert "tune_demo_plugin" not in sys.modules and "tune_broken_plugin" not in sys.modules


def test_load_imports_only_the_plugin_asked_for(installed):
    repeat = plugins.load("DEMO_REPEAT")
    assert repeat("ab") == "abab"
    assert "tune_demo_plugin.components" in sys.modules and "tune_broken_plugin" not in sys.modules
    assert plugins.load("no_such_plugin") is None


def test_a_broken_plugin_warns_once_naming_itself_and_the_error(installed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert plugins.load("broken_thing") is None
        assert plugins.load("broken_thing") is None
        loaded = plugins.load_all()
    messages = [str(w.message) for w in caught]
    assert messages == [
        "tune plugin 'broken_thing' (tune_broken_plugin:THING) failed to load and is ignored: "
        "RuntimeError: this plugin is broken on purpose"
    ]
    assert "demo_recipe" in loaded and "broken_thing" not in loaded


def test_load_all_filters_by_kind(installed):
    from tune.registry import ModelFamily

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        families = plugins.load_all(ModelFamily)
        recipes = plugins.load_all(plugins.RecipeSpec)
    assert list(families) == ["demo_family"] and list(recipes) == ["demo_recipe"]


@pytest.mark.parametrize(
    "path", ["demo_repeat", "Demo_Repeat", "tune_demo_plugin.components:repeat", "tune_demo_plugin.components.repeat"]
)
def test_a_plugin_object_is_named_by_entry_point_module_colon_attr_or_dotted_path(installed, path):
    assert plugins.resolve_object(path)("x", 3) == "xxx"
    assert instantiate({"_component_": path, "text": "yo", "times": 2}) == "yoyo"


def test_resolve_object_errors_name_the_problem(installed):
    with pytest.raises(ImportError, match="neither a dotted path nor the name of an installed tune plugin"):
        plugins.resolve_object("nothing_here")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ImportError, match="'broken_thing' failed to load: RuntimeError: this plugin is broken"):
            plugins.resolve_object("broken_thing")
    with pytest.raises(ImportError, match="cannot import 'tune_demo_plugin.components:nope'"):
        plugins.resolve_object("tune_demo_plugin.components:nope")
    with pytest.raises(ImportError, match="cannot import 'no_such_module_q:x'"):
        plugins.resolve_object("no_such_module_q:x")


def _tune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNE_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(GOOD), str(BROKEN), str(REPO)])
    cmd = [sys.executable, "-m", "tune._cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_an_installed_plugin_recipe_is_listed_and_runs_and_a_broken_one_only_warns(tmp_path):
    warning = (
        "tune: warning: tune plugin 'broken_thing' (tune_broken_plugin:THING) failed to load and is ignored: "
        "RuntimeError: this plugin is broken on purpose\n"
    )
    listing = _tune("ls", "demo_recipe", cwd=tmp_path)
    assert listing.returncode == 0
    assert listing.stdout.splitlines() == [
        "RECIPE                DISTRIBUTED  CONFIG",
        "demo_recipe (plugin)  no           demo/tiny",
    ]
    assert listing.stderr == warning  # exactly one warning, naming the plugin and its error

    run = _tune("run", "demo_recipe", "--config", "demo/tiny", "output_dir=out", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "out" / "plugin_result.json").read_text()) == {
        "greeting": "hi hi hi ",  # _component_: demo_repeat (the plugin's entry-point name), times 3
        "farewell": "byebye",  # _component_: tune_demo_plugin.components:repeat, default times 2
    }

    models = _tune("ls", "--models", "demo", cwd=tmp_path)
    assert models.returncode == 0, models.stderr
    assert models.stdout.splitlines()[-1].split() == ["demo_family", "demo", "demo_tiny"]
