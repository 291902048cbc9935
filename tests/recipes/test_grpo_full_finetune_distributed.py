"""Integration tests of recipes/grpo_full_finetune_distributed.py: 2 gloo ranks on CPU (torchrun), the tiny Llama of
tests/recipes/utils.py and the prompts of tests/recipes/test_grpo_full_finetune_single_device.py, one prompt per rank.

Each completion is sampled from its own generator (seeded by the run's seed, the epoch, the prompt's dataset index
and the completion's number), so 2 ranks with one prompt each sample what one rank with both prompts samples, and
train the same: the runs are compared step by step. Also: at step 1 the policy is the reference (KL exactly 0) and
the single pass is on-policy (nothing clipped, loss 0 up to rounding), a resumed run equals the uninterrupted one,
and the gathered model loads in transformers.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.test_grpo_full_finetune_single_device import write_sum_prompts
from tests.recipes.utils import ASSETS

pytestmark = pytest.mark.integration

RECIPE = "grpo_full_finetune_distributed"
CONFIG = ASSETS / "grpo_tiny_distributed.yaml"


def test_two_ranks_train_as_one_rank_with_both_prompts(tiny_assets, tmp_path):
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    common = [f"assets_dir={tiny_assets}", f"dataset.data_files={prompts}", "max_steps_per_epoch=2"]
    one, two = tmp_path / "one_rank", tmp_path / "two_ranks"
    run_concurrently(
        lambda: run_distributed(RECIPE, CONFIG, [*common, f"output_dir={one}", "batch_size=2"], tmp_path, nproc=1),
        lambda: run_distributed(RECIPE, CONFIG, [*common, f"output_dir={two}", "batch_size=1"], tmp_path),
    )
    single, double = train_log(one), train_log(two)
    assert sorted(single) == sorted(double) == [1, 2]
    # the same completions (rewards, lengths) and the same losses: the step-2 values follow a real update
    for key in ("reward", "completions/mean_length", "loss", "grad_norm"):
        assert max_difference(single, double, key) < 1e-5, (key, single, double)
    assert single[2]["loss"] != single[1]["loss"]


@pytest.mark.slow
def test_two_ranks_train_resume_exactly_and_load_in_transformers(tiny_assets, tmp_path):
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={out}",
        f"dataset.data_files={prompts}",
        "loss.beta=0.1",
        "ppo_epochs=1",
        "save_every_n_steps=1",
    ]
    run_distributed(RECIPE, CONFIG, overrides, cwd=tmp_path)
    uninterrupted = train_log(out)
    assert sorted(uninterrupted) == [1, 2, 3]
    assert uninterrupted[1]["kl"] == 0.0 and abs(uninterrupted[1]["loss"]) < 1e-6
    assert all(r["clip_ratio/region_mean"] == 0.0 for r in uninterrupted.values())
    assert uninterrupted[3]["kl"] > 0.0
    final = load_file(out / "step_3" / "model.safetensors")

    for name in ("step_2", "step_3", "logs"):  # "crash" after step 1
        shutil.rmtree(out / name)
    for name in ("step_2",):
        shutil.rmtree(out / "dcp" / name, ignore_errors=True)
    run_distributed(RECIPE, CONFIG, [*overrides, "resume_from_checkpoint=True"], cwd=tmp_path)
    resumed = train_log(out)
    assert sorted(resumed) == [2, 3]
    for step in (2, 3):
        for key in ("loss", "reward", "kl"):
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], abs=1e-6), (step, key)
    resumed_final = load_file(out / "step_3" / "model.safetensors")
    assert max((resumed_final[k] - final[k]).abs().max().item() for k in final) < 1e-6

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out / "step_3", dtype=torch.float32)
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 283, 311, 283, 308]])).logits).all()
