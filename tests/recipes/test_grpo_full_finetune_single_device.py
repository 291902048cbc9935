"""Integration tests of recipes/grpo_full_finetune_single_device.py: `tune run` on the tiny Llama of
tests/recipes/utils.py, prompts "a + b =" with their sums, rewarded by ``tune.rlhf.AnswerReward`` and a user's
reward (tests/recipes/assets/grpo_components.py: the share of digits, which varies between a random model's
samples, so the advantages are not all 0).
"""

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "grpo_full_finetune_single_device"
CONFIG = ASSETS / "grpo_tiny.yaml"


def write_sum_prompts(path: Path, num: int = 16, seed: int = 0) -> Path:
    """Prompt rows ``{"prompt": "3 + 4 =", "answer": "7"}``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"{a} + {b} =", "answer": str(a + b)})
    path.write_text(json.dumps(rows))
    return path


def _overrides(assets: Path, out: Path, prompts: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"dataset.data_files={prompts}", *extra]


def _log(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}


def test_on_policy_first_pass_and_kl_to_the_reference(tiny_assets, tmp_path):
    """ppo_epochs 1: every pass is the first over its batch, so it is on-policy: nothing is clipped and the grpo
    policy loss is -mean(advantages), 0 up to rounding. beta > 0: the reference is the starting model, so the KL
    of step 1 is exactly 0, and it grows once the policy moves."""
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    out = tmp_path / "run"
    extra = ("ppo_epochs=1", "loss.beta=0.1", "optimizer.lr=1e-2", "max_steps_per_epoch=3")
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, prompts, *extra), cwd=tmp_path)
    log = _log(out)
    assert sorted(log) == [1, 2, 3]
    for record in log.values():
        assert record["clip_ratio/region_mean"] == 0.0
        assert record["kl"] >= 0.0
        assert record["reward_std"] > 0  # the digit share varies: the advantages carry a signal
        for key in ("rewards/answer/mean", "rewards/digit_share/mean", "completions/mean_length", "lr", "grad_norm"):
            assert key in record, key
        assert record["tokens_per_second"] > 0
    assert log[1]["kl"] == 0.0 and abs(log[1]["loss"]) < 1e-6
    assert log[3]["kl"] > 0.0


def test_clipped_passes_resume_and_load_in_transformers(tiny_assets, tmp_path):
    """ppo_epochs 2 with a large LR: the second pass leaves the trust region (clipped tokens). A run stopped after
    step 1 and resumed equals the uninterrupted run (sampling seeds, data order, optimizer state), and the
    saved model loads in transformers."""
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    out = tmp_path / "run"
    common = ("optimizer.lr=3e-2", "save_every_n_steps=1", "max_steps_per_epoch=3")
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, prompts, *common), cwd=tmp_path)
    uninterrupted = _log(out)
    final = load_file(out / "step_3" / "model.safetensors")
    assert max(r["clip_ratio/region_mean"] for r in uninterrupted.values()) > 0

    for name in ("step_2", "step_3", "logs"):  # "crash" after step 1
        shutil.rmtree(out / name)
    run_recipe(
        RECIPE, CONFIG, _overrides(tiny_assets, out, prompts, *common, "resume_from_checkpoint=True"), cwd=tmp_path
    )
    resumed = _log(out)
    assert sorted(resumed) == [2, 3]
    for step in (2, 3):
        for key in ("loss", "reward", "completions/mean_length", "clip_ratio/region_mean"):
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], abs=1e-6), (step, key)
    resumed_final = load_file(out / "step_3" / "model.safetensors")
    max_diff = max((resumed_final[k] - final[k]).abs().max().item() for k in final)
    print("resumed vs uninterrupted final weights, max abs difference:", max_diff)
    assert max_diff < 1e-6

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out / "step_3", dtype=torch.float32)
    start = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    tokens = torch.tensor([[1, 283, 311, 283, 308]])
    assert torch.isfinite(model(input_ids=tokens).logits).all()
    assert not torch.equal(model.lm_head.weight, start.lm_head.weight)  # training moved the weights


def test_packing_is_refused_with_the_recipes_reason(tiny_assets, tmp_path):
    # the prompt datasets take no `packed` option: the recipe's UNSUPPORTED table names the reason, before any
    # weight is read (not a failure inside the dataset builder)
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    proc = run_recipe(
        RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "out", prompts, "dataset.packed=True"), tmp_path, check=False
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "dataset.packed = True: is not supported by this recipe (prompts are generated from one by one" in (
        proc.stderr
    )
