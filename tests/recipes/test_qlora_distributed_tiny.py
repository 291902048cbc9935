"""QLoRA at tiny dimensions under recipes/lora_finetune_distributed.py on 2 gloo ranks (torchrun, CPU).

The tiny Llama of tests/recipes/utils.py (embed_dim 128, 2 KV heads of 32, intermediate_dim 256) with
``model.quantize_base=True``: its q_proj (128 x 128) and k_proj/v_proj (64 x 128) weights are smaller than one
group of 256 block scales at torchao's default sizes, which FSDP cannot split over 2 ranks (torchao asserted
"quantization_factor.numel() not divisible by 2"). tune sizes their scale groups so they split (see
``tune.modules.peft.nf4_block_sizes``), quantising the same way on one device, so the 2-rank losses must equal the
single-device recipe's on the same global batch, from one shared PEFT starting adapter.
"""

import pytest

from tests.recipes.dist_utils import max_difference, run_distributed, train_log
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "lora_finetune_distributed"
CONFIG = ASSETS / "lora_tiny.yaml"  # LoRA rank 8, alpha 16 on q_proj, v_proj, output_proj and the MLP
STEPS = 3


def _overrides(assets, out, *extra):
    common = [f"assets_dir={assets}", f"output_dir={out}", f"max_steps_per_epoch={STEPS}", "shuffle=True"]
    return [*common, "model.quantize_base=True", *extra]


def test_tiny_qlora_two_ranks_match_one_device(tiny_assets, tmp_path):
    adapter = f"checkpointer.adapter_checkpoint={random_peft_adapter(tiny_assets, tmp_path / 'start_adapter')}"
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    run_recipe(
        "lora_finetune_single_device", CONFIG, _overrides(tiny_assets, single, adapter, "batch_size=4"), cwd=tmp_path
    )
    run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, two, adapter, "batch_size=2"), cwd=tmp_path)
    ref, got = train_log(single), train_log(two)
    loss_diff = max_difference(ref, got, "loss")
    print(f"tiny QLoRA: max |loss(2 ranks) - loss(1 device)| = {loss_diff:.2e} over {STEPS} steps")
    assert sorted(got) == list(range(1, STEPS + 1))
    assert loss_diff < 1e-4
    assert (two / f"step_{STEPS}" / "model.safetensors").is_file()  # the merged, dequantised model was written


def test_unshardable_nf4_weight_is_one_error_line(tiny_assets, tmp_path):
    # embed_dim 24 with 4 query and 4 KV heads of 6: q_proj is 24 x 24 = 9 blocks of 64, an odd number, so its
    # block scales can only form an odd number of groups (here 1), which 2 ranks cannot share. It fails before
    # any weight is read, so the checkpoint's other dimensions do not matter.
    extra = ["model.embed_dim=24", "model.num_kv_heads=4", "batch_size=2"]
    proc = run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "run", *extra), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    expected = "cannot shard the NF4 (QLoRA) base weight 'layers.0.attn.q_proj.weight' of shape (24, 24) over 2 ranks"
    # `tune run` reports the first rank that failed, once, in one line
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tune: error: rank ") and expected in line]
    assert lines, proc.stderr[-4000:]
    assert "quantize_base=False" in lines[0]
    assert "Traceback (most recent call last)" not in proc.stderr
    assert "AssertionError" not in proc.stderr
