"""`tune validate CONFIG [--recipe NAME] [--show-sample N] [key=value ...]` (tune/_cli/_validate.py)."""

import textwrap
from pathlib import Path

from tune.config import _discovery


def test_a_shipped_config_is_checked_against_the_recipe_that_claims_it(tune, shipped):
    code, out, err = tune("validate", "toy/tiny_echo")
    assert (code, out) == (0, "OK: toy/tiny_echo is valid for recipe echo_single_device\n")


def test_problems_are_listed_with_exit_1(tune, shipped, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text(
        textwrap.dedent("""\
        output_dir: ${nowhere}
        scaler:
          _component_: Scaler
          factr: 2.0
        things:
          - _component_: fractions.Fractoin
    """)
    )
    code, out, _ = tune("validate", str(config), "--recipe", "echo_single_device")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"{config}: 5 problems for recipe echo_single_device:"
    assert lines[1:] == [
        "  - output_dir = '${nowhere}': cannot resolve the interpolation: Interpolation key 'nowhere' not found",
        "  - scaler.factr = 2.0: Scaler has no argument 'factr'; did you mean 'factor'? "
        "it accepts: values, factor, offset",
        "  - scaler.factor: missing required argument 'factor' of Scaler (the recipe does not pass it either)",
        "  - things[0]._component_ = 'fractions.Fractoin': cannot import it: module 'fractions' has no attribute "
        "'Fractoin'; did you mean fractions.Fraction?",
        "  - message: missing: the recipe reads it (echo_single_device.py:34); add it to the config",
    ]


def test_overrides_are_applied_before_checking(tune, shipped):
    code, out, _ = tune("validate", "toy/tiny_echo", "~message", "scaler.offset=1")
    assert code == 1 and "message: missing: the recipe reads it" in out
    assert tune("validate", "toy/tiny_echo", "message=hi")[0] == 0


def test_without_a_recipe_it_says_what_was_not_checked(tune, shipped, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("a: 1\n")
    code, out, err = tune("validate", str(config))
    assert (code, out) == (0, f"OK: {config} is valid\n")
    assert "no recipe given (--recipe NAME)" in err


def test_yaml_syntax_error_has_the_line(tune, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("a: 1\nb: [1,\nc: 2\n")
    code, out, _ = tune("validate", str(config))
    assert code == 1 and "line 4: YAML syntax error at column 1" in out


def test_a_config_claimed_by_two_recipes_needs_recipe(tune, shipped, tmp_path, monkeypatch):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("a", "b"):
        (recipes / f"{name}.py").write_text("RECIPE_INFO = {'configs': ['toy/*']}\n")
    monkeypatch.setattr(_discovery, "shipped_dirs", lambda: (recipes, shipped / "configs"))
    code, _, err = tune("validate", "toy/tiny_echo")
    assert code == 1 and "several recipes claim 'toy/tiny_echo' (a, b); choose one with --recipe NAME" in err


def test_show_sample_prints_the_sample_with_trained_spans(tune, monkeypatch):
    # components come from toy_components.py in the working directory (tests/assets/cli)
    monkeypatch.chdir(Path(__file__).resolve().parents[2] / "assets" / "cli")
    code, out, _ = tune("validate", "sample.yaml", "--show-sample", "1")
    assert code == 0
    assert out.splitlines()[1:] == ["sample 1: 17 tokens, 5 trained (shown between [[ and ]])", "Q: greet A: [[hello]]"]
    code, _, err = tune("validate", "sample.yaml", "--show-sample", "2")
    assert code == 1 and "--show-sample 2: the dataset has 2 samples (0 to 1)" in err


def test_a_path_into_the_shipped_configs_is_checked_against_its_recipe(tune, shipped):
    code, out, _ = tune("validate", str(shipped / "configs" / "toy" / "tiny_echo.yaml"))
    assert code == 0 and out.endswith("is valid for recipe echo_single_device\n")
