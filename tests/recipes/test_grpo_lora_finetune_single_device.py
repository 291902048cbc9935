"""Integration tests of recipes/grpo_lora_finetune_single_device.py: `tune run` on the tiny Llama of
tests/recipes/utils.py with LoRA adapters, on the prompts of tests/recipes/test_grpo_full_finetune_single_device.py.
"""

import pytest
import torch

from tests.recipes.test_grpo_full_finetune_single_device import write_sum_prompts
from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "grpo_lora_finetune_single_device"
CONFIG = ASSETS / "grpo_lora_tiny.yaml"


def test_reference_is_the_model_without_adapters_and_outputs_load_in_peft(tiny_assets, tmp_path):
    """LoRA's B starts at 0, so at step 1 the policy is the adapter-free reference: the KL is exactly 0 and the
    first pass is on-policy (nothing clipped); the KL grows as the adapters learn. The adapter loads in PEFT and
    the merged model in transformers, and they agree."""
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={out}",
        f"dataset.data_files={prompts}",
        "loss.beta=0.1",
        "ppo_epochs=1",
        "optimizer.lr=3e-2",
    ]
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path)
    log = {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}
    assert sorted(log) == [1, 2, 3]
    assert log[1]["kl"] == 0.0 and abs(log[1]["loss"]) < 1e-6
    assert all(r["clip_ratio/region_mean"] == 0.0 for r in log.values())
    assert log[3]["kl"] > 0.0

    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    tokens = torch.tensor([[1, 283, 311, 283, 308, 283, 313]])
    base_logits = base(input_ids=tokens).logits
    peft_model = PeftModel.from_pretrained(base, out / "step_3" / "adapter")
    merged = LlamaForCausalLM.from_pretrained(out / "step_3", dtype=torch.float32)
    peft_logits, merged_logits = peft_model(input_ids=tokens).logits, merged(input_ids=tokens).logits
    torch.testing.assert_close(peft_logits, merged_logits, atol=1e-4, rtol=1e-4)
    assert (peft_logits - base_logits).abs().max() > 1e-3  # the adapters learned something


@pytest.mark.slow
def test_resume_equals_the_uninterrupted_run(tiny_assets, tmp_path):
    """Stopped after step 1 and resumed (adapter, optimizer, sampling seeds, data position): steps 2-3 and the
    final adapter equal the uninterrupted run's."""
    import shutil

    from safetensors.torch import load_file

    prompts = write_sum_prompts(tmp_path / "prompts.json")
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={out}",
        f"dataset.data_files={prompts}",
        "optimizer.lr=3e-2",
        "save_every_n_steps=1",
    ]
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path)
    log = {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}
    adapter = load_file(out / "step_3" / "adapter" / "adapter_model.safetensors")
    for name in ("step_2", "step_3", "logs"):
        shutil.rmtree(out / name)
    run_recipe(RECIPE, CONFIG, [*overrides, "resume_from_checkpoint=True"], cwd=tmp_path)
    resumed = {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}
    assert sorted(resumed) == [2, 3]
    for step in (2, 3):
        for key in ("loss", "reward", "clip_ratio/region_mean"):
            assert resumed[step][key] == pytest.approx(log[step][key], abs=1e-6), (step, key)
    resumed_adapter = load_file(out / "step_3" / "adapter" / "adapter_model.safetensors")
    assert max((resumed_adapter[k] - adapter[k]).abs().max().item() for k in adapter) < 1e-6
