"""A recipe copied with ``tune cp`` before the recipes handed their plumbing to ``tune/`` still runs, trains as the
shipped recipe does, and leaves checkpoints that the shipped recipe resumes.

tests/recipes/assets/copied_recipes/ holds ``lora_finetune_single_device.py`` and ``lora_finetune_distributed.py``
as they were before that change (commit 21b804a), unedited: what a user's copy looks like. They use the public
``tune.*`` API that the library keeps for them (``training.progress_state``, ``training.restore_progress``,
``DistributedCheckpointer``, ``training.init_device_mesh``, the peft helpers, ...).
"""

import shutil
from pathlib import Path

import pytest

from tests.recipes.dist_utils import run_distributed, train_log
from tests.recipes.utils import ASSETS, run_recipe

pytestmark = pytest.mark.integration

COPIED = ASSETS / "copied_recipes"
CONFIG = ASSETS / "lora_tiny.yaml"
STEPS = 4


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"max_steps_per_epoch={STEPS}", "save_every_n_steps=2", *extra]


def _losses(out: Path) -> dict[int, float]:
    return {step: record["loss"] for step, record in train_log(out).items() if "loss" in record}


def _resume_with_the_shipped_recipe(run, recipe: str, out: Path, dcp: bool, *extra: str) -> dict[int, float]:
    # drop what came after step 2; the shipped recipe resumes the copy's step-2 checkpoint
    for path in [out / "step_4", out / "logs", *([out / "dcp" / "step_4"] if dcp else [])]:
        shutil.rmtree(path, ignore_errors=True)
    run(recipe, out, "resume_from_checkpoint=True", *extra)
    return _losses(out)


def test_an_old_copy_of_lora_finetune_single_device_still_trains_and_its_checkpoint_resumes(tiny_assets, tmp_path):
    def run(recipe, out, *extra):
        run_recipe(recipe, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)

    copied, shipped = tmp_path / "copied", tmp_path / "shipped"
    run(str(COPIED / "lora_finetune_single_device.py"), copied)
    run("lora_finetune_single_device", shipped)
    assert sorted(_losses(copied)) == list(range(1, STEPS + 1))
    assert _losses(copied) == _losses(shipped)  # the same computation, to the bit
    uninterrupted = _losses(copied)
    resumed = _resume_with_the_shipped_recipe(run, "lora_finetune_single_device", copied, dcp=False)
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step


@pytest.mark.slow  # 2 gloo ranks, twice (~25 s); the single-device copies run in the default tier
def test_an_old_copy_of_lora_finetune_distributed_still_trains_and_its_checkpoint_resumes(tiny_assets, tmp_path):
    def run(recipe, out, *extra):
        run_distributed(recipe, CONFIG, _overrides(tiny_assets, out, "batch_size=2", *extra), cwd=tmp_path)

    copied, shipped = tmp_path / "copied", tmp_path / "shipped"
    run(str(COPIED / "lora_finetune_distributed.py"), copied)
    run("lora_finetune_distributed", shipped)
    assert sorted(_losses(copied)) == list(range(1, STEPS + 1))
    assert _losses(copied) == _losses(shipped)
    uninterrupted = _losses(copied)
    resumed = _resume_with_the_shipped_recipe(run, "lora_finetune_distributed", copied, dcp=True)
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step
