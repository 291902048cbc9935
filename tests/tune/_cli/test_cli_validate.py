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


def test_overrides_may_come_before_or_after_the_options(tune, shipped):
    # argparse alone takes every positional from the first run of them: `key=value` after `--recipe R` used to be
    # an unrecognized argument
    for args in (
        ("toy/tiny_echo", "--recipe", "echo_single_device", "~message"),
        ("--recipe", "echo_single_device", "toy/tiny_echo", "~message"),
        ("toy/tiny_echo", "scaler.offset=1", "--recipe", "echo_single_device", "~message"),
    ):
        code, out, err = tune("validate", *args)
        assert code == 1 and "message: missing: the recipe reads it" in out, (args, out, err)
    assert tune("validate", "toy/tiny_echo", "--recipe", "echo_single_device", "message=hi")[0] == 0
    code, _, err = tune("validate")
    assert code == 2 and "the following arguments are required: CONFIG\n" in err


def test_converter_order_and_schedule_patterns_are_checked_against_the_model(tune, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text(
        textwrap.dedent("""\
        model:
          _component_: torch.nn.Linear
          in_features: 4
          out_features: 2
        model_converters:
          - _component_: tune.training.QATConverter
          - _component_: tune.training.Float8TrainingConverter
        finetuning_schedule:
          - params: [bias]
            transition: {after_steps: 1}
          - params: [wieght]
    """)
    )
    code, out, _ = tune("validate", str(config))
    assert code == 1
    # the model is built on the meta device for its parameter names (weight, bias); float8 is not refused for
    # want of a GPU: only the classes are checked
    assert out.splitlines() == [
        f"{config}: 2 problems:",
        "  - model_converters: invalid model_converters order:",
        "      model_converters[0] (Int8DynActInt4WeightQATConverter, kind 'qat') and model_converters[1] "
        "(Float8TrainingConverter, kind 'float8') cannot be combined (both replace the same layers): keep one of "
        "them in `model_converters:`.",
        "  - finetuning_schedule: invalid finetuning_schedule:",
        "      finetuning_schedule[1].params: 'wieght' matches no parameter; close names: weight",
        "      (patterns are globs over parameter names such as 'layers.3.*' or 'output', or 're:' followed by a "
        "regular expression)",
    ]
    code, out, _ = tune("validate", str(config), "~model_converters", "finetuning_schedule[1].params=[weight]")
    assert (code, out) == (0, f"OK: {config} is valid\n")
    bad_transition = "finetuning_schedule[0].transition={after_step: 1}"
    code, out, _ = tune("validate", str(config), "~model_converters", bad_transition)
    assert code == 1 and "unknown transition 'after_step' (did you mean 'after_steps'?)" in out


def test_a_model_that_cannot_be_built_on_meta_leaves_the_patterns_unchecked_with_a_note(tune, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text(
        "model:\n  _component_: torch.nn.Linear\n  in_features: -1\n  out_features: 2\n"
        "finetuning_schedule: [{params: [nothing_like_it]}]\n"
    )
    code, out, err = tune("validate", str(config))
    assert (code, out) == (0, f"OK: {config} is valid\n")
    assert "note: finetuning_schedule patterns were not checked against the model" in err
    assert "the phases' syntax was checked" in err
