"""Integration tests of recipes/lora_finetune_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with
gloo, on the tiny Llama of tests/recipes/utils.py.

The reference is the single-device LoRA recipe on the same global batch (2 ranks x batch 2, or x batch 1 x 2
accumulation steps, see the same 4 samples per step as 1 device x batch 4). Both start from one adapter written
by ``peft`` with random A and B (``adapter_checkpoint``): each recipe draws fresh adapters from its own random
stream (one device initialises the whole model, the distributed recipe only the adapters), so only a shared
starting adapter makes 5 steps comparable, and a non-zero B makes the first loss depend on it.
"""

import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes.dist_utils import VAL, max_difference, run_distributed, train_log, validation_logits
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "lora_finetune_distributed"
CONFIG = ASSETS / "lora_tiny.yaml"  # LoRA rank 8, alpha 16 on q_proj, v_proj, output_proj and the MLP
STEPS = 5
COMMON = [f"max_steps_per_epoch={STEPS}", "shuffle=True"]


def _overrides(assets: Path, out: Path, adapter: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"checkpointer.adapter_checkpoint={adapter}", *COMMON, *extra]


def test_two_ranks_match_one_device_and_outputs_load_in_peft(tiny_assets, tmp_path):
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter")
    single, two, accumulated = tmp_path / "single", tmp_path / "two_ranks", tmp_path / "accumulated"
    run_recipe(
        "lora_finetune_single_device",
        CONFIG,
        _overrides(tiny_assets, single, adapter, "batch_size=4", *VAL),
        cwd=tmp_path,
    )
    run_distributed(
        RECIPE,
        CONFIG,
        _overrides(
            tiny_assets,
            two,
            adapter,
            "batch_size=2",
            "save_every_n_steps=2",
            "enable_activation_checkpointing=True",
            *VAL,
        ),
        cwd=tmp_path,
    )
    run_distributed(
        RECIPE,
        CONFIG,
        _overrides(tiny_assets, accumulated, adapter, "batch_size=1", "gradient_accumulation_steps=2"),
        cwd=tmp_path,
    )
    ref, got, got_accumulated = train_log(single), train_log(two), train_log(accumulated)

    assert sorted(got) == sorted(got_accumulated) == list(range(1, STEPS + 1))
    loss_diff, accumulated_diff = max_difference(ref, got, "loss"), max_difference(ref, got_accumulated, "loss")
    print(f"LoRA: max |loss(2 ranks) - loss(1 device)| = {loss_diff:.2e}; with accumulation 2: {accumulated_diff:.2e}")
    assert loss_diff < 1e-4 and accumulated_diff < 1e-4
    assert max_difference(ref, got, "grad_norm") < 1e-4 * ref[1]["grad_norm"]
    assert abs(got[STEPS]["val_loss"] - ref[STEPS]["val_loss"]) < 1e-4

    # outputs gathered to rank 0: merged model + PEFT adapter at steps 2, 4, 5; adapter-only resume state at 2, 4
    assert sorted(p.name for p in two.glob("step_*")) == ["step_2", "step_4", "step_5"]
    assert sorted(p.name for p in (two / "dcp").glob("step_*")) == ["step_2", "step_4"]
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = two / f"step_{STEPS}"
    merged = validation_logits(LlamaForCausalLM.from_pretrained(final, dtype=torch.float32), tiny_assets)
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    with_adapter = validation_logits(PeftModel.from_pretrained(base, final / "adapter"), tiny_assets)
    torch.testing.assert_close(with_adapter, merged, atol=1e-5, rtol=0)  # the adapter is the merged update
    reference = LlamaForCausalLM.from_pretrained(single / f"step_{STEPS}", dtype=torch.float32)
    ref_logits = validation_logits(reference, tiny_assets)
    logits_diff = (merged - ref_logits).abs().max()
    print(f"LoRA: max |logits(2 ranks) - logits(1 device)| after {STEPS} steps = {logits_diff:.2e}")
    torch.testing.assert_close(merged, ref_logits, atol=1e-4, rtol=0)


def test_resume_across_two_ranks_reproduces_the_uninterrupted_run(tiny_assets, tmp_path):
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter")
    out = tmp_path / "run"
    # the LR schedule and shuffling must resume exactly too
    common = _overrides(
        tiny_assets,
        out,
        adapter,
        "batch_size=2",
        "save_every_n_steps=2",
        "lr_scheduler._component_=tune.training.get_cosine_schedule_with_warmup",
        "lr_scheduler.num_warmup_steps=1",
    )
    run_distributed(RECIPE, CONFIG, common, cwd=tmp_path)
    uninterrupted = train_log(out)
    for path in [out / "step_4", out / "step_5", out / "dcp" / "step_4", out / "logs"]:
        shutil.rmtree(path)
    run_distributed(RECIPE, CONFIG, [*common, "resume_from_checkpoint=True"], cwd=tmp_path)
    resumed = train_log(out)
    assert sorted(resumed) == [3, 4, 5]
    for step in resumed:  # same adapters, optimizer state, data order, LR schedule and RNG
        assert resumed[step]["loss"] == pytest.approx(uninterrupted[step]["loss"], abs=1e-6, rel=0), step
        assert resumed[step]["lr"] == pytest.approx(uninterrupted[step]["lr"], rel=1e-9)


@pytest.mark.slow
def test_tensor_parallelism_is_refused_for_lora_layers(tiny_assets, tmp_path):
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter")
    proc = run_distributed(
        RECIPE,
        CONFIG,
        _overrides(tiny_assets, tmp_path / "run", adapter, "tensor_parallel_dim=2"),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1
    assert "is a LoRA/DoRA layer" in proc.stderr and "tensor_parallel_dim: 1" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr


@pytest.mark.slow
def test_dora_two_ranks_match_one_device(tiny_assets, tmp_path):
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter", use_dora=True)  # with PEFT's magnitudes
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    extra = ["model.use_dora=True", "max_steps_per_epoch=3"]
    run_recipe(
        "lora_finetune_single_device",
        CONFIG,
        _overrides(tiny_assets, single, adapter, "batch_size=4", *extra),
        cwd=tmp_path,
    )
    run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, two, adapter, "batch_size=2", *extra), cwd=tmp_path)
    loss_diff = max_difference(train_log(single), train_log(two), "loss")
    print(f"DoRA: max |loss(2 ranks) - loss(1 device)| = {loss_diff:.2e}")
    assert loss_diff < 1e-4


@pytest.mark.slow
def test_qlora_two_ranks_match_one_device(tiny_assets, tmp_path):
    # NF4 weights are split by whole groups of double-quantised block scales; at this width (twice the tiny one)
    # the weights keep QLoRA's real-size groups of 256 scales (16384 values), as real models shard them
    # (tests/recipes/test_qlora_distributed_tiny.py covers the tiny dims' smaller groups)
    from transformers import LlamaConfig, LlamaForCausalLM

    wide = dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    config = LlamaConfig(
        vocab_size=320,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **wide,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "wide", safe_serialization=True)
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter", model_dir=tmp_path / "wide")
    extra = [
        "model.quantize_base=True",
        "model.embed_dim=256",
        "model.intermediate_dim=512",
        f"checkpointer.checkpoint_dir={tmp_path / 'wide'}",
        "max_steps_per_epoch=3",
    ]
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    run_recipe(
        "lora_finetune_single_device",
        CONFIG,
        _overrides(tiny_assets, single, adapter, "batch_size=4", *extra),
        cwd=tmp_path,
    )
    run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, two, adapter, "batch_size=2", *extra), cwd=tmp_path)
    loss_diff = max_difference(train_log(single), train_log(two), "loss")
    print(f"QLoRA: max |loss(2 ranks) - loss(1 device)| = {loss_diff:.2e}")
    assert loss_diff < 1e-4
