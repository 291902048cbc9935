"""torchtune 0.6.1's own fine-tuning configs validate under tune after ``torchtune.`` -> ``tune.``.

The configs come from torchtune's published 0.6.1 wheel, fetched at test time with ``pip download`` into
``~/.cache/tune-tests`` (nothing is copied into this repository). Which recipe runs each config is read from the
wheel's ``torchtune/_recipe_registry.py`` (its ``Recipe(name=..., configs=[Config(name=...)])`` literals), so the
set below is torchtune's, not a hand-kept list: every config of a family tune ships whose recipe is a
full / LoRA / QLoRA / QAT fine-tuning recipe. torchtune's QAT recipes are run by tune's full and LoRA recipes
(``tune.config.RECIPE_ALIASES``), their ``quantizer:`` read as a QAT model converter (docs/migrating.md).

Only paths are overridden (``output_dir``, the checkpointer's directory, the tokenizer's file). A config naming
an optional dependency that is not installed (``bitsandbytes`` optimizers) is counted apart: it must fail with
exactly one problem naming the extra that installs it.
"""

import ast
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tune.config import find_recipe, validate_config
from tune.config._discovery import RECIPE_ALIASES

pytestmark = pytest.mark.integration

_VERSION = "0.6.1"
_CACHE = Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests")) / f"torchtune-{_VERSION}"
# the families tune ships, by torchtune's config folder name
_FAMILIES = ("llama2", "llama3", "llama3_1", "llama3_2", "llama3_3", "mistral", "qwen2_5", "qwen3", "gemma2", "phi3")
# torchtune's fine-tuning recipes (not DPO, PPO, knowledge distillation, evaluation or generation)
_SFT_RECIPES = (
    "full_finetune_single_device",
    "full_finetune_distributed",
    "lora_finetune_single_device",
    "lora_finetune_distributed",
    *RECIPE_ALIASES,
)
# optional packages a torchtune config may name as a component, and the tune extra that installs each
_OPTIONAL = {"bitsandbytes": "bitsandbytes"}


@pytest.fixture(scope="session")
def torchtune_wheel() -> Path:
    """torchtune's 0.6.1 wheel, downloaded once and kept in ``~/.cache/tune-tests`` (``TUNE_TEST_CACHE``)."""
    found = sorted(_CACHE.glob(f"torchtune-{_VERSION}-*.whl"))
    if not found:
        _CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", f"torchtune=={_VERSION}", "--no-deps", "-d", str(_CACHE)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        found = sorted(_CACHE.glob(f"torchtune-{_VERSION}-*.whl"))
        assert found, f"cannot download torchtune {_VERSION} ({' '.join(cmd)}): {proc.stderr.strip()[-500:]}"
    return found[-1]


def _recipe_of_configs(registry_source: str) -> dict[str, str]:
    """config name -> recipe name, from the literals of torchtune's ``_recipe_registry.py``."""
    recipe_of = {}
    for node in ast.walk(ast.parse(registry_source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Recipe"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        recipe = ast.literal_eval(keywords["name"])
        for config in ast.walk(keywords["configs"]):
            if isinstance(config, ast.Call) and getattr(config.func, "id", None) == "Config":
                name = next(ast.literal_eval(k.value) for k in config.keywords if k.arg == "name")
                recipe_of[name] = recipe
    return recipe_of


@pytest.fixture(scope="session")
def published_configs(torchtune_wheel, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """config name -> (torchtune recipe, the config with ``torchtune.`` replaced by ``tune.``, as a file)."""
    out = tmp_path_factory.mktemp("torchtune_configs")
    with zipfile.ZipFile(torchtune_wheel) as wheel:
        recipe_of = _recipe_of_configs(wheel.read("torchtune/_recipe_registry.py").decode())
        selected = {}
        for name, recipe in sorted(recipe_of.items()):
            if name.split("/")[0] not in _FAMILIES or recipe not in _SFT_RECIPES:
                continue
            text = wheel.read(f"recipes/configs/{name}.yaml").decode().replace("torchtune.", "tune.")
            path = out / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            selected[name] = (recipe, path)
    return selected


def _path_overrides(tmp_path: Path) -> list[str]:
    return [
        f"output_dir={tmp_path / 'out'}",
        f"checkpointer.checkpoint_dir={tmp_path / 'checkpoint'}",
        f"checkpointer.output_dir={tmp_path / 'out'}",
        f"tokenizer.path={tmp_path / 'tokenizer.model'}",
    ]


def _missing_optional(path: Path) -> str | None:
    """The optional package the config names as a component that is not installed, if any."""
    text = path.read_text()
    for module in _OPTIONAL:
        if f"_component_: {module}." in text and importlib.util.find_spec(module) is None:
            return module
    return None


def test_published_sft_configs_validate(published_configs, tmp_path, capsys):
    overrides = _path_overrides(tmp_path)
    passed, needs_extra, failed = [], {}, {}
    for name, (recipe, path) in published_configs.items():
        problems = [str(p) for p in validate_config(path, find_recipe(recipe).path, overrides)]
        module = _missing_optional(path)
        if module is not None:
            needs_extra[name] = problems
        elif not problems:
            passed.append(name)
        else:
            failed[name] = problems
    total = len(published_configs)
    with capsys.disabled():
        print(
            f"\ntorchtune {_VERSION} SFT configs: validate {len(passed)}/{total}; "
            f"{len(needs_extra)} need an optional extra that is not installed ({', '.join(_OPTIONAL)}); "
            f"{len(failed)} fail"
        )
        for name, problems in failed.items():
            print(f"  {name}: {' | '.join(problems)}")
    assert 80 <= total <= 100, f"expected about 90 configs from torchtune's registry, found {total}"
    assert not failed, "\n".join(f"{name}: {' | '.join(problems)}" for name, problems in failed.items())
    for name, problems in needs_extra.items():
        # one problem, on the component, naming the package that is missing
        assert len(problems) == 1 and "pip install 'tune[bitsandbytes]'" in problems[0], (name, problems)


def test_qat_recipe_names_run_tune_recipes_with_the_qat_converter(published_configs):
    from tune.config import load_config

    qat = {name: recipe for name, (recipe, _) in published_configs.items() if recipe in RECIPE_ALIASES}
    assert qat, "torchtune's registry lists QAT configs of the shipped families"
    for name, recipe in qat.items():
        assert find_recipe(recipe).name == RECIPE_ALIASES[recipe]
        cfg = load_config(published_configs[name][1])
        assert "quantizer" not in cfg
        # torchtune's Int8DynActInt4WeightQATQuantizer(groupsize=256) as tune's converter with the same groupsize
        assert [dict(c) for c in cfg.model_converters] == [
            {"_component_": "tune.training.Int8DynActInt4WeightQATConverter", "groupsize": 256}
        ]
