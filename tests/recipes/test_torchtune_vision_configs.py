"""torchtune 0.6.1's Llama 3.2 Vision training configs, migrated by ``torchtune.`` -> ``tune.``, validate and run.

The configs come from torchtune's published wheel (cached in ``~/.cache/tune-tests``, as in
tests/recipes/test_torchtune_published_configs.py, whose helpers this module imports); which recipe runs each
config is read from the wheel's ``_recipe_registry.py``. Every ``llama3_2_vision`` config of a fine-tuning recipe
is taken: 11B full / LoRA / QLoRA on one device and on several, 90B full / LoRA / QLoRA on several.

Each config validates against tune's recipe of torchtune's name, and runs (``tune run <that name>``, distributed
recipes on 2 gloo ranks) at tiny scale with tests/recipes/_vision_llama_assets.py's model, tokenizer and colour
task. Overridden: ``output_dir``, the model node (the family's component builder at tiny dimensions, trainable
parts and LoRA settings kept), the tokenizer's file, tile size and length, the checkpointer's directory, the
dataset, ``device=cpu dtype=fp32 batch_size=2 max_steps_per_epoch=2``. The checkpointer's directory holds the tiny
checkpoint in as many shards as the config's ``checkpoint_files: {filename_format, max_filename}`` names (5 for
11B, 37 for 90B, the released layouts), so ``checkpoint_files`` is kept. 11B_full_single_device's
``bitsandbytes.optim.PagedAdamW8bit`` validates as one problem naming ``tune[bitsandbytes]`` when that package is
not installed, and then runs with ``torch.optim.AdamW`` (as in test_torchtune_published_configs.py). Nothing else
needed overriding (``EXTRA_OVERRIDES``): ``custom_sharded_layers: ['decoder.tok_embeddings']`` of the full
distributed configs names a module of tune's model too. Each run exits 0, logs a finite loss for each step and
writes the last step's checkpoint.

Default tier: 11B_qlora_single_device and 11B_full (2 ranks); the others are slow.
"""

import math
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.recipes import _vision_llama_assets as assets
from tests.recipes.dist_utils import run_distributed
from tests.recipes.test_torchtune_published_configs import (  # noqa: F401  (torchtune_wheel: the session fixture)
    _OPTIMIZER_FALLBACK,
    _SFT_RECIPES,
    _VERSION,
    _error_lines,
    _missing_optional,
    _recipe_of_configs,
    torchtune_wheel,
)
from tests.recipes.utils import read_jsonl, run_recipe
from tune.config import find_recipe, validate_config

pytestmark = pytest.mark.integration

FAMILY = "llama3_2_vision"
EXPECTED = [
    "11B_full", "11B_full_single_device", "11B_lora", "11B_lora_single_device", "11B_qlora",
    "11B_qlora_single_device", "90B_full", "90B_lora", "90B_qlora",
]  # fmt: skip
DEFAULT_TIER = {"11B_qlora_single_device", "11B_full"}
STEPS = 2
# Overrides beyond paths, model dimensions, data, device/dtype, batch size and steps that the migrated configs need
# (each one a finding; none was needed).
EXTRA_OVERRIDES: list[str] = []


@pytest.fixture(scope="session")
def vision_configs(torchtune_wheel, tmp_path_factory) -> dict[str, tuple[str, Path]]:  # noqa: F811
    """config name (``11B_full``) -> (torchtune's recipe, the migrated config as a file)."""
    out = tmp_path_factory.mktemp("torchtune_vision_configs")
    with zipfile.ZipFile(torchtune_wheel) as wheel:
        recipe_of = _recipe_of_configs(wheel.read("torchtune/_recipe_registry.py").decode())
        selected = {}
        for name, recipe in sorted(recipe_of.items()):
            family, _, short = name.partition("/")
            if family != FAMILY or recipe not in _SFT_RECIPES:
                continue
            path = out / f"{short}.yaml"
            path.write_text(wheel.read(f"recipes/configs/{name}.yaml").decode().replace("torchtune.", "tune."))
            selected[short] = (recipe, path)
    return selected


def test_the_vision_training_configs_are_torchtunes_nine(vision_configs):
    assert sorted(vision_configs) == EXPECTED


def test_migrated_vision_configs_validate(vision_configs, tmp_path):
    failed, needs_extra = {}, []
    for name, (recipe, path) in vision_configs.items():
        problems = [str(p) for p in validate_config(path, find_recipe(recipe).path, [f"output_dir={tmp_path}"])]
        if _missing_optional(path) is not None:  # 11B_full_single_device: bitsandbytes' PagedAdamW8bit
            # one problem, on the component, naming the extra that installs the package
            assert len(problems) == 1 and "pip install 'tune[bitsandbytes]'" in problems[0], (name, problems)
            needs_extra.append(name)
        elif problems:
            failed[name] = problems
    passed = len(vision_configs) - len(failed) - len(needs_extra)
    total = len(vision_configs)
    print(f"\ntorchtune {_VERSION} {FAMILY} configs: validate {passed}/{total}; need bitsandbytes: {needs_extra}")
    assert not failed, "\n".join(f"{name}: {' | '.join(problems)}" for name, problems in failed.items())


def _overrides(cfg: dict, data: Path, out: Path) -> list[str]:
    files = cfg["checkpointer"]["checkpoint_files"]
    num_shards = int(files["max_filename"]) if isinstance(files, dict) else 1
    checkpoint = assets.sharded_checkpoint(data, num_shards) if num_shards > 1 else data / "hf"
    overrides = assets.tiny_run_overrides(cfg["model"]["_component_"], data, out, STEPS)
    overrides = [o for o in overrides if not o.startswith("checkpointer.checkpoint_dir=")]
    overrides += [f"checkpointer.checkpoint_dir={checkpoint}", *EXTRA_OVERRIDES]
    if cfg["optimizer"]["_component_"].startswith("bitsandbytes."):  # the optional package is not installed
        overrides.append(f"optimizer._component_={_OPTIMIZER_FALLBACK}")
    return overrides


def _run_config(name: str, recipe: str, path: Path, data: Path, tmp_path: Path) -> str | None:
    """Runs one config; None when it ran and checked out, else what went wrong."""
    cfg = yaml.safe_load(path.read_text())
    out = tmp_path / name
    overrides = _overrides(cfg, data, out)
    if recipe.endswith("_distributed"):
        proc = run_distributed(recipe, path, overrides, cwd=tmp_path, check=False)
    else:
        proc = run_recipe(recipe, path, overrides, cwd=tmp_path, timeout=300, check=False)
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {_error_lines(proc.stdout + proc.stderr)}"
    losses = {r["step"]: r["loss"] for log in sorted(out.rglob("*.jsonl")) for r in read_jsonl(log) if "loss" in r}
    if sorted(losses) != list(range(1, STEPS + 1)) or not all(math.isfinite(v) for v in losses.values()):
        return f"losses {losses}, expected finite losses of steps 1..{STEPS}"
    if not any((out / f"step_{STEPS}").glob("*.safetensors")):
        return f"no checkpoint in {out / f'step_{STEPS}'}"
    return None


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT_TIER else pytest.mark.slow) for n in EXPECTED]
)
def test_migrated_vision_config_runs(vision_configs, tmp_path, name):
    recipe, path = vision_configs[name]
    error = _run_config(name, recipe, path, assets.shared_assets(), tmp_path)
    assert error is None, f"{name} ({recipe}): {error}"
