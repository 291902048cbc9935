"""tune/config/_discovery.py: recipes and configs found from files, RECIPE_INFO read with ast, plugin recipes."""

import sys
from pathlib import Path

import pytest

from tune.config import (
    ConfigError,
    RecipeError,
    builtin_configs,
    builtin_recipes,
    configs_of,
    find_config,
    find_recipe,
    list_configs,
    list_recipes,
    read_recipe_info,
    recipes_for_config,
    shipped_dirs,
)

REPO = Path(__file__).resolve().parents[3]


def test_shipped_dirs_in_a_source_checkout_are_the_top_level_folders():
    recipes, configs = shipped_dirs()
    assert recipes == REPO / "recipes"
    assert configs in (REPO / "configs", None)  # None only while configs/ does not exist


def test_builtin_recipes_and_configs_are_read_from_the_files(shipped):
    assert sorted(builtin_recipes()) == ["dev/no_info", "dist_echo", "echo_single_device"]
    assert sorted(builtin_configs()) == ["echo_default", "toy/tiny_dist", "toy/tiny_echo"]
    echo = builtin_recipes()["echo_single_device"]
    assert echo.path == shipped / "recipes" / "echo_single_device.py"
    assert not echo.supports_distributed and builtin_recipes()["dist_echo"].supports_distributed
    assert not builtin_recipes()["dev/no_info"].has_info


def test_configs_are_claimed_by_the_patterns_in_recipe_info(shipped):
    recipes = builtin_recipes()
    assert sorted(configs_of(recipes["echo_single_device"])) == ["echo_default", "toy/tiny_echo"]
    assert sorted(configs_of(recipes["dist_echo"])) == ["toy/tiny_dist"]
    assert configs_of(recipes["dev/no_info"]) == {}
    assert [r.name for r in recipes_for_config("toy/tiny_echo", recipes.values())] == ["echo_single_device"]


def test_read_recipe_info_never_imports_the_recipe(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        "raise SystemExit('imported!')\nRECIPE_INFO: dict = {'supports_distributed': True, 'configs': ['a/*']}\n"
    )
    assert read_recipe_info(path) == {"supports_distributed": True, "configs": ["a/*"]}
    (tmp_path / "none.py").write_text("x = 1\n")
    assert read_recipe_info(tmp_path / "none.py") is None


def test_a_recipe_file_is_read_again_once_it_changes(tmp_path):
    """Recipe files are parsed once per version (tune run / validate read them many times): an edit, even within
    the same second and to a text of the same length, is seen; a caller changing the result changes no cache."""
    from tune.config._recipe_scan import scan_recipe

    path = tmp_path / "r.py"
    path.write_text("RECIPE_INFO = {'configs': ['a/*']}\ndef f(cfg):\n    return cfg.alpha\n")
    info, scan = read_recipe_info(path), scan_recipe(path)
    assert info == {"configs": ["a/*"]} and set(scan.mentioned) == {"alpha"}
    info["configs"].append("b/*")
    scan.mentioned.add("gamma")
    assert read_recipe_info(path) == {"configs": ["a/*"]} and set(scan_recipe(path).mentioned) == {"alpha"}
    path.write_text("RECIPE_INFO = {'configs': ['b/*']}\ndef f(cfg):\n    return cfg.omega\n")
    assert read_recipe_info(path) == {"configs": ["b/*"]} and set(scan_recipe(path).mentioned) == {"omega"}


@pytest.mark.parametrize(
    "source, match",
    [
        ("RECIPE_INFO = dict(configs=[])\n", "must be a literal dict"),
        ("RECIPE_INFO = {'supports_distributed': 'yes'}\n", r"\['supports_distributed'\] must be a bool"),
        ("RECIPE_INFO = {'configs': 'a/*'}\n", r"\['configs'\] must be a list"),
        ("RECIPE_INFO = {'configs': [1]}\n", "must list fnmatch patterns"),
        ("RECIPE_INFO = [\n", "syntax error at line 1"),
    ],
)
def test_malformed_recipe_info_is_an_error_naming_the_file(tmp_path, source, match):
    path = tmp_path / "r.py"
    path.write_text(source)
    with pytest.raises(RecipeError, match=match):
        read_recipe_info(path)


def test_find_recipe_by_name_path_relative_path(shipped, tmp_path, monkeypatch):
    assert find_recipe("echo_single_device").source == "built-in"
    assert find_recipe("dev/no_info").name == "dev/no_info"
    script = tmp_path / "mine.py"
    script.write_text("RECIPE_INFO = {'supports_distributed': True}\n")
    absolute = find_recipe(str(script))
    assert (absolute.name, absolute.path, absolute.source, absolute.supports_distributed) == (
        "mine",
        script,
        "file",
        True,
    )
    monkeypatch.chdir(tmp_path)
    assert find_recipe("mine.py").path == script
    assert find_recipe("./mine.py").path == script


def test_unknown_recipe_suggests_close_names(shipped):
    with pytest.raises(RecipeError, match="unknown recipe 'echo_single'; did you mean echo_single_device"):
        find_recipe("echo_single")


def test_missing_recipe_file_names_the_path_and_the_builtin(shipped, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as info:
        find_recipe("echo_single_device.py")
    assert f"recipe file not found: {tmp_path}/echo_single_device.py" in str(info.value)
    assert "the built-in recipe is named 'echo_single_device'" in str(info.value)


def test_find_config_by_name_or_path(shipped, tmp_path):
    assert find_config("toy/tiny_echo") == shipped / "configs" / "toy" / "tiny_echo.yaml"
    mine = tmp_path / "my.yaml"
    mine.write_text("a: 1\n")
    assert find_config(str(mine)) == mine


def test_unknown_config_suggests_close_names(shipped):
    with pytest.raises(ConfigError, match="unknown config 'toy/tiny_eco'; did you mean toy/tiny_echo"):
        find_config("toy/tiny_eco")
    with pytest.raises(ConfigError, match=r"config file not found: .*toy/tiny_echo.yaml \(the built-in config is"):
        find_config("toy/tiny_echo.yaml")


def test_plugin_recipes_and_their_configs_are_discovered(shipped, demo_plugin):
    with pytest.warns(UserWarning, match="broken_thing"):
        recipes = list_recipes()
    demo = recipes["demo_recipe"]  # the entry point is `Demo_Recipe`: names are lower-cased
    assert demo.source == "plugin" and demo.path.name == "recipe.py"
    assert list(configs_of(demo)) == ["demo/tiny"]
    assert "demo/tiny" in list_configs()
    assert find_recipe("Demo_Recipe").path == demo.path
    assert find_config("demo/tiny") == demo.plugin_configs["demo/tiny"]
    assert find_recipe("tune_demo_plugin:RECIPE").path == demo.path  # module:attr works too


def test_a_plugin_that_is_not_a_recipe_cannot_be_run(shipped, demo_plugin):
    with pytest.raises(RecipeError, match="'demo_repeat' is a function, not a tune.plugins.RecipeSpec"):
        find_recipe("demo_repeat")


def test_a_broken_plugin_recipe_says_it_failed_to_load(shipped, demo_plugin):
    with pytest.warns(UserWarning, match="broken on purpose"):
        with pytest.raises(RecipeError, match="'broken_thing' failed to load"):
            find_recipe("broken_thing")
    sys.modules.pop("tune_broken_plugin", None)
