"""Every recipe kind in bf16 on the GPU against its fp32 run: 3 steps on the tiny Llama of tests/recipes.

SFT, LoRA, QLoRA, DoRA, LoRA DPO and knowledge distillation compare bf16 on the GPU with fp32 on the CPU (the
reference). GRPO and PPO sample completions with generators on the model's device, and CUDA and CPU generators
draw different numbers from one seed, so those two compare bf16 with fp32 on the GPU, which draw the same noise.

All use SGD: AdamW's first update is about lr * sign(grad), so gradient entries at rounding level would flip
their update between the runs (see SGD in test_gpu_training.py).
"""

from pathlib import Path

import pytest

from tests.gpu._checks import DEVICE, check_close, check_losses
from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.test_grpo_full_finetune_single_device import write_sum_prompts
from tests.recipes.test_knowledge_distillation_single_device import _save_hf_llama as save_teacher
from tests.recipes.test_ppo_full_finetune_single_device import _save_reward_model, _write_prompts
from tests.recipes.utils import ASSETS, build_tiny_assets, loss_records, losses_by_step, run_recipe

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

SGD = "optimizer._component_=torch.optim.SGD"
# bf16 keeps 8 significant bits: step N's loss within N * 2^-8 relative of fp32's (test_gpu_training.BF16_REL)
BF16_REL = 2**-8


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """The tiny assets, plus preference pairs, a KD teacher, GRPO prompts, and PPO's reward model and prompts."""
    root = build_tiny_assets(tmp_path_factory.mktemp("gpu_recipe_assets"))
    write_preference_messages(root / "pairs.json", 8, seed=0)
    save_teacher(root / "teacher", num_layers=3, intermediate_size=384, seed=1)
    write_sum_prompts(root / "sums.json", num=8)
    _save_reward_model(root / "llama", root / "rm", last_token_only=False)
    _write_prompts(root / "prompts.json", 16)
    return root


def _run(recipe: str, config: str, assets: Path, out: Path, device: str, dtype: str, *extra: str) -> Path:
    overrides = [
        f"assets_dir={assets}", f"output_dir={out}", f"device={device}", f"dtype={dtype}", "log_every_n_steps=1",
        SGD, *extra,
    ]  # fmt: skip
    run_recipe(recipe, ASSETS / config, overrides, cwd=out.parent, timeout=300)
    return out


SUPERVISED = {
    # lr 0.1, not the config's 1e-3: an SGD update below half a bf16 unit of its weight (|w| ~ 0.08) is rounded
    # away, so at 1e-3 bf16 barely trains while fp32 does (measured on the CPU: step 3 off by 1.6 * 2^-8 at 1e-3,
    # 0.11 * 2^-8 at 0.1)
    "full": ("full_finetune_single_device", "full_tiny.yaml", ("optimizer.lr=0.1",)),
    "lora": ("lora_finetune_single_device", "lora_tiny.yaml", ()),
    "qlora": ("lora_finetune_single_device", "lora_tiny.yaml", ("model.quantize_base=True",)),
    "dora": ("lora_finetune_single_device", "lora_tiny.yaml", ("model.use_dora=True",)),
    "lora_dpo": ("lora_dpo_single_device", "lora_dpo_tiny.yaml", ("dataset.data_files=${assets_dir}/pairs.json",)),
    "kd": ("knowledge_distillation_single_device", "kd_tiny.yaml", ("teacher_dir=${assets_dir}/teacher",)),
}


@pytest.mark.parametrize("kind", list(SUPERVISED))
def test_bf16_on_device_tracks_fp32_on_cpu(kind, assets, tmp_path):
    """Per-step losses of bf16 on the device within N * 2^-8 relative of fp32 on the CPU. QLoRA: both sides
    quantise the checkpoint to NF4 (from bf16 on one side, fp32 on the other: a value within rounding of a level
    boundary may land on the neighbouring level, rare enough to stay inside the bf16 tolerance)."""
    recipe, config, extra = SUPERVISED[kind]
    fp32 = losses_by_step(_run(recipe, config, assets, tmp_path / "fp32", "cpu", "fp32", *extra))
    bf16 = losses_by_step(_run(recipe, config, assets, tmp_path / "bf16", DEVICE, "bf16", *extra))
    assert sorted(fp32) == [1, 2, 3]
    check_losses(f"{kind}: bf16 on {DEVICE} vs fp32 on cpu, loss per step", bf16, fp32, BF16_REL)


# Gradient norms: each gradient entry sums products of bf16 activations through 2 layers' forward and backward
# matmuls; the norm averages their errors, so it stays within a few units of 2^-8 relative: 2^-5 (8 units) allowed.
GRAD_NORM_REL = 2**-5
PPO_REL = 2**-3


def test_grpo_bf16_tracks_fp32_on_device(assets, tmp_path):
    """GRPO, both runs on the device (same sampling noise): step 1 only, the step whose completions the two runs
    sample from the same weights. With ppo_epochs 1 the logged loss is -mean(advantages) = 0 up to rounding, so
    what is compared is the rewards (equal: the same completions) and the gradient norm."""
    extra = ("dataset.data_files=${assets_dir}/sums.json", "ppo_epochs=1", "max_steps_per_epoch=1")
    recipe, config = "grpo_full_finetune_single_device", "grpo_tiny.yaml"
    (fp32,) = loss_records(_run(recipe, config, assets, tmp_path / "fp32", DEVICE, "fp32", *extra))
    (bf16,) = loss_records(_run(recipe, config, assets, tmp_path / "bf16", DEVICE, "bf16", *extra))
    same = ("reward", "completions/mean_length")
    assert {k: bf16[k] for k in same} == {k: fp32[k] for k in same}, "bf16 sampled other completions than fp32"
    check_close(
        f"grpo step 1: grad_norm, bf16 vs fp32 on {DEVICE}", bf16["grad_norm"], fp32["grad_norm"], rel=GRAD_NORM_REL
    )


def test_ppo_bf16_tracks_fp32_on_device(assets, tmp_path):
    """PPO, both runs on the device (same sampling noise and minibatch order): step 1, one on-policy update of the
    whole batch (ppo_epochs 1, one minibatch), whose loss and gradient norm depend on the sampled responses."""
    extra = (
        "dataset.data_files=${assets_dir}/prompts.json", "ppo_epochs=1", "ppo_batch_size=4", "num_steps=4",
    )  # fmt: skip
    recipe, config = "ppo_full_finetune_single_device", "ppo_tiny.yaml"
    (fp32,) = loss_records(_run(recipe, config, assets, tmp_path / "fp32", DEVICE, "fp32", *extra))
    (bf16,) = loss_records(_run(recipe, config, assets, tmp_path / "bf16", DEVICE, "bf16", *extra))
    assert bf16["response_lengths"] == fp32["response_lengths"], "bf16 sampled other responses than fp32"
    # the score is a dot product of cancelling terms, the advantages are rewards minus values: each is a difference
    # of bf16-rounded numbers several times its size, so its relative error is several units of 2^-8 (measured on
    # the CPU: scores 1.8e-2, policy loss 4.2e-2, value loss 4.3e-3, loss 2.6e-2); 2^-3 allowed
    for name in ("scores", "policy_loss", "value_loss", "loss"):
        check_close(f"ppo step 1: {name}, bf16 vs fp32 on {DEVICE}", bf16[name], fp32[name], rel=PPO_REL)
    check_close(
        f"ppo step 1: grad_norm, bf16 vs fp32 on {DEVICE}", bf16["grad_norm"], fp32["grad_norm"], rel=GRAD_NORM_REL
    )
