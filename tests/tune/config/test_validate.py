"""tune/config/_validate.py: every problem of a config found at once, without building anything."""

import textwrap
from pathlib import Path

import pytest

from tune.config import validate_config

COMPONENTS = """
CALLS = []


class Optimizer:
    def __init__(self, params, lr: float, momentum: float = 0.0):
        CALLS.append("Optimizer")


def build_model(num_layers: int, dim: int = 8):
    CALLS.append("build_model")
    raise RuntimeError("validate must never build anything")


def dataset(tokenizer, source: str, **load_kwargs):
    CALLS.append("dataset")


def tokenizer(path: str, max_seq_len: int = 2048):
    CALLS.append("tokenizer")


def wrapper(inner, scale: float = 1.0):
    CALLS.append("wrapper")
"""

RECIPE = """
from tune import config


class LocalLoss:
    def __init__(self, reduction="mean"):
        pass


@config.parse
def recipe_main(cfg):
    model = config.instantiate(cfg.model)
    tok = config.instantiate(cfg.tokenizer)
    opt = config.instantiate(cfg.optimizer, model.parameters())
    data = config.instantiate(cfg.dataset, tok)
    loss = config.instantiate(cfg.loss)
    for _ in range(cfg.epochs):
        pass
    print(cfg.output_dir, cfg.get("optional_thing"))
"""

GOOD = """
output_dir: /tmp/out
epochs: 1
model:
  _component_: valmod.build_model
  num_layers: 2
tokenizer:
  _component_: valmod.tokenizer
  path: ${output_dir}/tok.model
optimizer:
  _component_: valmod.Optimizer
  lr: 1e-3
dataset:
  _component_: valmod.dataset
  source: tatsu-lab/alpaca
  split: train           # accepted by **load_kwargs
loss:
  _component_: LocalLoss  # defined in the recipe file
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    (tmp_path / "valmod.py").write_text(COMPONENTS)
    (tmp_path / "recipe.py").write_text(RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "valmod", raising=False)

    def write(text: str):
        path = tmp_path / "config.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return tmp_path, write


def test_a_clean_config_has_no_problems_and_nothing_is_built(files):
    tmp_path, write = files
    assert validate_config(write(GOOD), tmp_path / "recipe.py") == []
    import valmod

    assert valmod.CALLS == []  # imported to read signatures, never called


def test_every_problem_is_reported_at_once_with_key_path_and_value(files):
    tmp_path, write = files
    bad = GOOD.replace("epochs: 1\n", "") + textwrap.dedent(
        """
        log_dir: ${nope}/logs
        seed: ???
        collate_fn: tune.config.instantiat
        metrics:
          - _component_: valmod.wrapper
            inner:
              _component_: valmod.Optimizer   # nested: nothing is passed to it, params and lr are missing
            scael: 2.0
          - _component_: valmod.no_such_thing
        """
    )
    bad = (
        bad.replace("  num_layers: 2\n", "  num_layer: 2\n")
        .replace("  lr: 1e-3\n", "  lr: 1e-3\n  params: []\n")
        .replace("_component_: LocalLoss", "_component_: LocalLoss\n  reduce: sum")
    )
    problems = [str(p) for p in validate_config(write(bad), tmp_path / "recipe.py")]
    expected = [
        "model.num_layer = 2: valmod.build_model has no argument 'num_layer'; did you mean 'num_layers'?",
        "model.num_layers: missing required argument 'num_layers' of valmod.build_model",
        "optimizer.params = []: the recipe already passes 'params' of valmod.Optimizer positionally",
        "loss.reduce = 'sum': LocalLoss has no argument 'reduce'",
        "log_dir = '${nope}/logs': cannot resolve the interpolation",
        "seed = '???': mandatory value not set",
        "collate_fn = 'tune.config.instantiat': cannot import it",
        "metrics[0].scael = 2.0: valmod.wrapper has no argument 'scael'; did you mean 'scale'?",
        "metrics[0].inner.params: missing required argument 'params' of valmod.Optimizer",
        "metrics[0].inner.lr: missing required argument 'lr' of valmod.Optimizer",
        "metrics[1]._component_ = 'valmod.no_such_thing': cannot import it",
        "epochs: missing: the recipe reads it (recipe.py:",
    ]
    for start in expected:
        assert any(p.startswith(start) for p in problems), f"{start!r} not in:\n" + "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)


def test_without_a_recipe_top_level_arguments_the_recipe_may_pass_are_not_required(files):
    tmp_path, write = files
    # optimizer lacks `params` and dataset lacks `tokenizer`: a recipe passes those; nested ones still count
    # `loss` becomes a top-level wrapper without its required `inner`: a recipe might pass it, so without the
    # recipe only unknown arguments are checked there
    text = GOOD.replace("_component_: LocalLoss  # defined in the recipe file", "_component_: valmod.wrapper")
    assert validate_config(write(text)) == []
    nested = (
        text + "extra:\n  holder:\n    _component_: valmod.wrapper\n    inner:\n      _component_: valmod.tokenizer\n"
    )
    problems = [str(p) for p in validate_config(write(nested))]
    assert problems == ["extra.holder.inner.path: missing required argument 'path' of valmod.tokenizer"]


def test_yaml_syntax_errors_stop_the_check_with_a_line_number(files):
    tmp_path, write = files
    (problem,) = validate_config(write("a: 1\nb: [1,\nc: 2\n"), tmp_path / "recipe.py")
    assert problem.line == 4 and "YAML syntax error" in problem.message


def test_overrides_are_applied_first_and_bad_ones_reported_with_the_rest(files):
    tmp_path, write = files
    problems = [str(p) for p in validate_config(write(GOOD), tmp_path / "recipe.py", ["~epochs", "oops"])]
    assert any(p.startswith("epochs: missing: the recipe reads it") for p in problems)
    assert any("bad override 'oops'" in p for p in problems)
    fixed = validate_config(
        write(GOOD.replace("num_layers: 2", "num_layers: ???")), tmp_path / "recipe.py", ["model.num_layers=4"]
    )
    assert fixed == []


def test_a_component_module_failing_on_import_is_reported_not_raised(files):
    tmp_path, write = files
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('boom')\n")
    text = GOOD + "extra:\n  _component_: explodes_on_import.thing\n"
    problems = [str(p) for p in validate_config(write(text), tmp_path / "recipe.py")]
    assert problems == ["extra._component_ = 'explodes_on_import.thing': importing it failed: RuntimeError: boom"]


def test_shipped_fixture_configs_validate_against_their_recipe(shipped):
    recipe = shipped / "recipes" / "echo_single_device.py"
    for name in ("toy/tiny_echo.yaml", "echo_default.yaml"):
        assert validate_config(shipped / "configs" / name, recipe) == []


def test_a_plugin_config_validates_against_its_plugin_recipe(shipped, demo_plugin):
    import warnings

    from tune.config import find_config, find_recipe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broken fixture plugin's warning
        recipe = find_recipe("demo_recipe")
        assert validate_config(find_config("demo/tiny"), recipe.path) == []
        problems = validate_config(find_config("demo/tiny"), recipe.path, ["greeting.tims=2", "~farewell"])
    assert [str(p).split(":")[0] for p in problems] == ["greeting.tims = 2", "farewell"]


def test_values_are_checked_against_the_component_annotations(tmp_path, monkeypatch):
    # a module of components with every kind of annotation the check reads
    (tmp_path / "annotated.py").write_text(
        textwrap.dedent(
            """
            from typing import Literal, Optional

            def build(
                rank: int,
                scale: float = 1.0,
                packed: bool = False,
                mode: Literal["sum", "mean"] = "sum",
                limit: Optional[int] = None,
                loose: int = None,
                names: list[str] | None = None,
                anything=None,
            ):
                return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from tune.config import value_problems

    def problems(**args):
        return [str(p) for p in value_problems({"node": {"_component_": "annotated.build", **args}})]

    assert problems(rank=8, scale=2, packed=True, mode="mean", limit=None, loose=None, names=["a"], anything="x") == []
    assert problems(rank="eight") == [
        "node.rank = 'eight': must be an integer (argument 'rank' of annotated.build); got a string"
    ]
    assert problems(rank=8.0, packed="maybe", mode="max", limit="ten", names="a") == [
        "node.rank = 8.0: must be an integer (argument 'rank' of annotated.build); got a number",
        "node.packed = 'maybe': must be true or false (argument 'packed' of annotated.build); got a string",
        "node.mode = 'max': must be one of 'sum', 'mean' (argument 'mode' of annotated.build); got a string",
        "node.limit = 'ten': must be an integer or null (argument 'limit' of annotated.build); got a string",
        "node.names = 'a': must be a list or null (argument 'names' of annotated.build); got a string",
    ]
    assert problems(rank=True) == [
        "node.rank = True: must be an integer (argument 'rank' of annotated.build); got a boolean"
    ]
    # a nested component is built at run time: its node is not the argument's value
    assert problems(rank={"_component_": "annotated.build", "rank": 2}) == []


def test_a_config_still_naming_torchtune_components_says_to_run_tune_migrate(tmp_path):
    # the shipped LoRA test config with torchtune's prefix, as a torchtune user has it before `tune migrate`
    source = (Path(__file__).parents[2] / "recipes" / "assets" / "lora_tiny.yaml").read_text()
    path = tmp_path / "torchtune_lora.yaml"
    path.write_text(source.replace("_component_: tune.", "_component_: torchtune."))
    problems = [
        p
        for p in validate_config(str(path), overrides=["assets_dir=/tmp", "output_dir=/tmp/out"])
        if "torchtune" in str(p)
    ]
    assert problems, "the torchtune components were not reported"
    for problem in problems:
        assert "a torchtune name; run `tune migrate CONFIG`" in str(problem) and "docs/migrating.md" in str(problem)
    assert any("(it becomes 'tune.models.llama2.lora_llama2')" in str(p) for p in problems)
