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

Each config is also run, ``tune run <its torchtune recipe name>`` (distributed recipes on 2 gloo ranks), at tiny
scale with tests/recipes/_family_assets.py's per-family tiny checkpoint and tokenizer. Overridden: the model node
(the family's component builder at tiny dimensions, LoRA settings kept), the tokenizer's files, the checkpointer's
paths and files (the same weights in Meta's format for configs read with FullModelMetaCheckpointer), the dataset
(``alpaca_dataset`` on a tiny JSON file), ``output_dir``, ``device=cpu``, ``dtype=fp32``, ``batch_size=2``,
``max_steps_per_epoch=2``; and a ``bitsandbytes`` optimizer (not installed) becomes ``torch.optim.AdamW``. Each run
must exit 0, log a finite first loss and a loss for every step, and write the last step's checkpoint. The default
tier runs one config per (family, recipe kind); the slow tier runs every config.
"""

import ast
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import read_jsonl, run_recipe
from tune.config import find_recipe, validate_config
from tune.config._discovery import RECIPE_ALIASES

pytestmark = pytest.mark.integration

_VERSION = "0.6.1"
_CACHE = Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests")) / f"torchtune-{_VERSION}"
# the families tune ships, by torchtune's config folder name
_FAMILIES = (
    "llama2",
    "code_llama2",
    "llama3",
    "llama3_1",
    "llama3_2",
    "llama3_3",
    "mistral",
    "qwen2_5",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "phi4",
    "qwen2",
)
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
# the recipe kinds the default tier runs one config of, per family (the slow tier runs every config). The
# distributed kinds run in the slow tier to keep `make test` short (the distributed recipes are tested by default
# in test_*_distributed.py).
_DEFAULT_KINDS = ("full single-device", "lora single-device", "qlora single-device", "qat")


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
    assert 110 <= total <= 125, f"expected about 118 configs from torchtune's registry, found {total}"
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


# ---------------------------------------------------------------------------------------------------------------
# Running them: `tune run <torchtune's recipe name>` at tiny scale.
# ---------------------------------------------------------------------------------------------------------------

# torchtune 0.6.1 ships configs of every family above but Qwen3 (added to torchtune after 0.6.1)
_RUN_FAMILIES = tuple(f for f in _FAMILIES if f != "qwen3")
_STEPS_PER_EPOCH = 2
# what replaces an optimizer from a package that is not installed (the run says so in its overrides)
_OPTIMIZER_FALLBACK = "torch.optim.AdamW"


def _method(model_component: str) -> str:
    """``full``, ``lora`` or ``qlora``: which of tune's builders the tiny model node uses."""
    builder = model_component.rsplit(".", 1)[-1]
    return "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"


def _kind(recipe: str, method: str) -> str:
    """The recipe kind the default tier takes one config of, per family."""
    if recipe in RECIPE_ALIASES:
        return "qat"
    where = "distributed" if recipe.endswith("_distributed") else "single-device"
    if recipe.startswith("full_"):
        return f"full {where}"
    return f"{method} {where}"


@pytest.fixture(scope="session")
def run_assets(tmp_path_factory):
    """family -> its tiny assets directory (``hf/model.safetensors`` and ``train.json``), each built once."""
    root = tmp_path_factory.mktemp("published_run_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")

    @functools.cache
    def build(family: str) -> Path:
        return assets.build_family_assets(family, root / family)

    return build


def _meta_checkpoint(data: Path) -> Path:
    """``data/meta``: the tiny HF checkpoint's weights in Meta's format (``consolidated.00.pth``, ``params.json``),
    for the Llama configs read with FullModelMetaCheckpointer; written once per family."""
    from safetensors.torch import load_file

    from tune.training.checkpointing._formats import hf_to_meta

    meta = data / "meta"
    if not (meta / "params.json").is_file():
        meta.mkdir(exist_ok=True)
        state = hf_to_meta(load_file(data / "hf" / "model.safetensors"), assets.NUM_HEADS, assets.NUM_KV_HEADS)
        torch.save(state, meta / "consolidated.00.pth")
        params = dict(
            dim=assets.EMBED_DIM,
            n_heads=assets.NUM_HEADS,
            n_kv_heads=assets.NUM_KV_HEADS,
            n_layers=assets.NUM_LAYERS,
            vocab_size=assets.vocab_size(data.name),
            norm_eps=1e-5,  # the tiny Llama 3 checkpoint's rms_norm_eps (_family_assets.hf_config)
        )
        (meta / "params.json").write_text(json.dumps(params))
    return meta


def _tokenizer_overrides(family: str, node: dict) -> list[str]:
    """The tiny tokenizer, in the form the config names it: torchtune's Qwen configs give ``vocab.json`` and
    ``merges_file``, its Phi-4 configs ``vocab_path`` and ``merges_path``, which the tiny tokenizers' directories
    also hold."""
    path = assets.tokenizer_file(assets.FAMILIES[family].tokenizer)
    if "merges_file" in node:
        return [f"tokenizer.path={path.parent / 'vocab.json'}", f"tokenizer.merges_file={path.parent / 'merges.txt'}"]
    if "merges_path" in node:  # torchtune's Phi-4 configs
        vocab, merges = path.parent / "vocab.json", path.parent / "merges.txt"
        return [f"tokenizer.vocab_path={vocab}", f"tokenizer.merges_path={merges}"]
    return [f"tokenizer.path={path}"]


def _error_lines(output: str) -> str:
    """The lines of a failed run that say what failed (torchrun's own summary dropped), else its last lines."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "elastic/errors.html" not in line]
    errors = [line for line in errors if not line.startswith(("error_file", "torch.distributed.elastic"))]
    return " / ".join((errors or lines)[-2:])


def _run_overrides(family: str, cfg: dict, data: Path, out: Path) -> list[str]:
    meta = cfg["checkpointer"]["_component_"].endswith("FullModelMetaCheckpointer")
    overrides = [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *assets.model_overrides(family, _method(cfg["model"]["_component_"])),
        *_tokenizer_overrides(family, cfg["tokenizer"]),
        f"tokenizer.max_seq_len={assets.MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={_meta_checkpoint(data) if meta else data / 'hf'}",
        f"checkpointer.checkpoint_files=[{'consolidated.00.pth' if meta else 'model.safetensors'}]",
        f"checkpointer.output_dir={out}",
        "dataset._component_=tune.datasets.alpaca_dataset",
        "dataset.source=json",
        f"dataset.data_files={data / 'train.json'}",
        "dataset.split=train",
        "batch_size=2",
        f"max_steps_per_epoch={_STEPS_PER_EPOCH}",
    ]
    if cfg["optimizer"]["_component_"].split(".")[0] in _OPTIONAL:  # bitsandbytes is not installed
        overrides.append(f"optimizer._component_={_OPTIMIZER_FALLBACK}")
    return overrides


def _run_config(name: str, recipe: str, path: Path, data: Path, tmp_path: Path) -> str | None:
    """Runs one config; None when it ran, else what went wrong (the tail of its output, or the failed check)."""
    import yaml

    cfg = yaml.safe_load(path.read_text())
    family = name.split("/")[0]
    out = tmp_path / name.replace("/", "_")
    overrides = _run_overrides(family, cfg, data, out)
    if recipe.endswith("_distributed"):
        proc = run_distributed(recipe, path, overrides, cwd=tmp_path, check=False)
    else:
        proc = run_recipe(recipe, path, overrides, cwd=tmp_path, timeout=300, check=False)
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {_error_lines(proc.stdout + proc.stderr)}"
    last_step = cfg.get("epochs", 1) * _STEPS_PER_EPOCH
    logs = sorted(out.rglob("*.jsonl"))
    losses = {r["step"]: r["loss"] for log in logs for r in read_jsonl(log) if "loss" in r}
    if sorted(losses) != list(range(1, last_step + 1)):
        return f"logged losses of steps {sorted(losses)} in {[str(p) for p in logs]}, expected 1..{last_step}"
    if not math.isfinite(losses[1]):
        return f"first loss {losses[1]}"
    if not (out / f"step_{last_step}").is_dir():
        return f"no checkpoint {out / f'step_{last_step}'}: {sorted(p.name for p in out.iterdir())}"
    return None


def _run_all(selected: dict[str, tuple[str, Path]], run_assets, tmp_path, family: str, tier: str) -> None:
    failed = {}
    swapped = [name for name, (_, path) in selected.items() if _missing_optional(path) is not None]
    for name, (recipe, path) in selected.items():
        failed[name] = _run_config(name, recipe, path, run_assets(family), tmp_path)
    failed = {name: error for name, error in failed.items() if error is not None}
    print(f"\ntorchtune {_VERSION} {family} SFT configs ({tier}): run {len(selected) - len(failed)}/{len(selected)}")
    if swapped:
        print(f"  optimizer swapped to {_OPTIMIZER_FALLBACK} (bitsandbytes not installed): {', '.join(swapped)}")
    for name, error in failed.items():
        print(f"  {name}: {error}")
    assert not failed, "\n".join(f"{name}: {error}" for name, error in failed.items())


def _family_configs(published_configs, family: str) -> dict[str, tuple[str, Path]]:
    found = {n: rp for n, rp in published_configs.items() if n.split("/")[0] == family}
    assert found, f"torchtune {_VERSION} lists no {family} fine-tuning config"
    return found


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f in assets.VARIANT_FAMILIES else f for f in _RUN_FAMILIES]
)
def test_published_sft_configs_run_one_per_recipe_kind(published_configs, run_assets, tmp_path, family):
    import yaml

    selected = {}
    kinds = set()
    for name, (recipe, path) in _family_configs(published_configs, family).items():
        kind = _kind(recipe, _method(yaml.safe_load(path.read_text())["model"]["_component_"]))
        if kind not in kinds and kind in _DEFAULT_KINDS:
            kinds.add(kind)
            selected[name] = (recipe, path)
    _run_all(selected, run_assets, tmp_path, family, f"one per kind: {', '.join(sorted(kinds))}")


@pytest.mark.slow
@pytest.mark.parametrize("family", _RUN_FAMILIES)
def test_published_sft_configs_run_every_config(published_configs, run_assets, tmp_path, family):
    _run_all(_family_configs(published_configs, family), run_assets, tmp_path, family, "every config")
