"""tune/config/_imports.py: the modules a config lists under `imports:` are imported before anything is built."""

import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from tune.config import ConfigError, import_modules, parse, validate_config

PREFIX = "imports_probe_"  # every module the tests write starts with it, so the fixture can forget them


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A folder on sys.path where a test writes modules: ``write(name, source)``."""
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

    def write(name: str, source: str) -> None:
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            if parent.name:
                (tmp_path / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source))

    yield write
    for module in [m for m in sys.modules if m.startswith(PREFIX)]:
        del sys.modules[module]


def test_modules_are_imported_in_order_and_their_code_runs(user_code):
    user_code(f"{PREFIX}log", "ORDER = []\n")
    user_code(f"{PREFIX}pkg.first", f"import {PREFIX}log\n{PREFIX}log.ORDER.append('first')\n")
    user_code(f"{PREFIX}pkg.second", f"import {PREFIX}log\n{PREFIX}log.ORDER.append('second')\n")
    cfg = OmegaConf.create({"imports": [f"{PREFIX}pkg.second", f"{PREFIX}pkg.first"], "model": {"_component_": "x"}})
    assert import_modules(cfg) == [f"{PREFIX}pkg.second", f"{PREFIX}pkg.first"]
    assert sys.modules[f"{PREFIX}log"].ORDER == ["second", "first"]


def test_no_key_null_a_single_string_and_interpolations(user_code):
    user_code(f"{PREFIX}one", "")
    assert import_modules(OmegaConf.create({"a": 1})) == []
    assert import_modules(OmegaConf.create({"imports": None})) == []
    assert import_modules(OmegaConf.create({"imports": f"{PREFIX}one"})) == [f"{PREFIX}one"]
    cfg = OmegaConf.create({"name": f"{PREFIX}one", "imports": ["${name}"]})
    assert import_modules(cfg) == [f"{PREFIX}one"]


def test_every_bad_entry_is_reported_with_its_key(user_code):
    user_code(f"{PREFIX}boom", "raise RuntimeError('bad setting in my module')\n")
    user_code(f"{PREFIX}needs_dep", f"import {PREFIX}not_installed_dependency\n")
    cfg = OmegaConf.create(
        {"imports": [f"{PREFIX}missing.components", f"{PREFIX}boom", f"{PREFIX}needs_dep", "not a module", 3]}
    )
    with pytest.raises(ConfigError) as info:
        import_modules(cfg)
    problems = [str(p) for p in info.value.problems]
    assert problems == [
        f"imports[0] = '{PREFIX}missing.components': cannot import the module: there is no module named "
        f"'{PREFIX}missing'; make it importable: install its package, add the folder that holds it to PYTHONPATH, "
        "or run from that folder (the working directory is importable)",
        f"imports[1] = '{PREFIX}boom': importing the module failed: RuntimeError: bad setting in my module",
        # the module exists: what is missing is a dependency of its own, named as such
        f"imports[2] = '{PREFIX}needs_dep': importing the module failed: ModuleNotFoundError: No module named "
        f"'{PREFIX}not_installed_dependency'",
        "imports[3] = 'not a module': must be a dotted module name such as my_project.components",
        "imports[4] = 3: must be a dotted module name such as my_project.components",
    ]
    assert isinstance(info.value.__cause__, ModuleNotFoundError)  # shown with TUNE_DEBUG=1


def test_imports_must_be_a_list():
    with pytest.raises(ConfigError, match=r"imports = \{'a': 1\}: must be a list of module names"):
        import_modules(OmegaConf.create({"imports": {"a": 1}}))


def test_the_working_directory_is_importable(tmp_path, monkeypatch):
    (tmp_path / f"{PREFIX}local.py").write_text("VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert import_modules(OmegaConf.create({"imports": [f"{PREFIX}local"]})) == [f"{PREFIX}local"]
        assert sys.modules[f"{PREFIX}local"].VALUE == 7
    finally:
        sys.modules.pop(f"{PREFIX}local", None)


seen_by_recipe = []


@parse
def recipe_main(cfg):
    seen_by_recipe.append(f"{PREFIX}registers" in sys.modules)


def test_parse_imports_before_the_recipe_runs_and_reports_a_missing_module_in_one_line(
    user_code, tmp_path, capsys, monkeypatch
):
    user_code(f"{PREFIX}registers", "")
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"imports: [{PREFIX}registers]\n")
    seen_by_recipe.clear()
    recipe_main(["--config", str(config_file)])
    assert seen_by_recipe == [True]

    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["my_recipe.py"])
    with pytest.raises(SystemExit) as info:
        recipe_main(["--config", str(config_file), f"imports=[{PREFIX}nowhere]"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"my_recipe.py: error: imports[0] = '{PREFIX}nowhere': cannot import the module: ")
    assert err.count("\n") == 1 and seen_by_recipe == [True]  # one line; the recipe never ran


def test_validate_config_imports_first_and_reports_what_does_not_import(user_code, tmp_path):
    # the component lives in a module only `imports:` makes importable under this name
    user_code(f"{PREFIX}components", "def build(size: int):\n    return size\n")
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        f"imports: [{PREFIX}components, {PREFIX}absent]\nthing:\n  _component_: {PREFIX}components.build\n  siz: 1\n"
    )
    problems = [str(p) for p in validate_config(config_file)]
    assert len(problems) == 2
    assert problems[0].startswith(f"imports[1] = '{PREFIX}absent': cannot import the module")
    assert problems[1].startswith(f"thing.siz = 1: {PREFIX}components.build has no argument 'siz'")
