"""Integration tests of recipes/lora_finetune_single_device.py: `tune run` on a tiny Llama for a few steps.

The reference is Hugging Face PEFT on ``transformers``: the recipe starts from a PEFT adapter made here (random A
and B, so the adapter matters from the first step), the reference trains the same PEFT model with
``torch.optim.AdamW`` in a plain loop (tests/recipes/utils.py ``reference_run``), and losses, gradient norms
and the trained adapter must agree.
"""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes.utils import ASSETS, loss_records, losses_by_step, pad_batch, reference_run, run_recipe, tiny_dataset

pytestmark = pytest.mark.integration

RECIPE = "lora_finetune_single_device"
CONFIG = ASSETS / "lora_tiny.yaml"
LR, WEIGHT_DECAY = 1e-2, 0.01
# lora_tiny.yaml adapts q_proj, v_proj, output_proj and the MLP: their Hugging Face names
HF_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(assets: Path, use_dora: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    torch.manual_seed(1)
    config = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=HF_TARGETS, use_dora=use_dora, init_lora_weights=False
    )
    return get_peft_model(base, config)


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", *extra]


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_losses_and_adapter_match_peft_and_only_adapters_change(tiny_assets, tmp_path, use_dora):
    start = tmp_path / "initial_adapter"
    _peft_model(tiny_assets, use_dora).save_pretrained(start)
    out = tmp_path / "run"
    extra = [f"checkpointer.adapter_checkpoint={start}", f"model.use_dora={use_dora}"]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)

    records = loss_records(out)
    ref_model = _peft_model(tiny_assets, use_dora)
    ref_losses, ref_grad_norms, ref_model = reference_run(tiny_assets, 3, 4, LR, WEIGHT_DECAY, model=ref_model)
    losses = [r["loss"] for r in records]
    print("recipe losses   ", losses, "\nreference losses", ref_losses)
    assert losses == pytest.approx(ref_losses, abs=1e-5, rel=0)
    assert [r["grad_norm"] for r in records] == pytest.approx(ref_grad_norms, rel=1e-4)

    # the saved adapter is a PEFT adapter equal to the reference's after the same 3 steps
    adapter_dir = out / "step_3" / "adapter"
    config = (adapter_dir / "adapter_config.json").read_text()
    assert f'"use_dora": {str(use_dora).lower()}' in config
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    reference = {k: v for k, v in ref_model.state_dict().items() if "lora_" in k}
    assert len(saved) == len(reference) > 0
    for key, value in reference.items():
        # PEFT's file keys drop the adapter name, and DoRA's magnitude is saved without ".weight"
        saved_key = key.replace(".default", "").replace("lora_magnitude_vector.weight", "lora_magnitude_vector")
        torch.testing.assert_close(saved[saved_key], value, atol=1e-4, rtol=0, msg=key)

    # only adapters learned: the merged model equals the reference merge, and unadapted weights equal the base
    merged = load_file(out / "step_3" / "model.safetensors")
    base = load_file(tiny_assets / "llama" / "model.safetensors")
    reference_merged = ref_model.merge_and_unload().state_dict()
    for key, value in base.items():
        if any(f".{name}." in key for name in HF_TARGETS):
            torch.testing.assert_close(merged[key], reference_merged[key], atol=1e-4, rtol=0, msg=key)
        else:
            assert torch.equal(merged[key], value), key


def _base_first_loss(assets: Path) -> float:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    dataset = tiny_dataset(assets)
    tokens, labels = pad_batch([dataset[i] for i in range(4)])
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()).item()


def test_qlora_runs_and_saves_a_dequantised_merged_model(tiny_assets, tmp_path):
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "model.quantize_base=True"), cwd=tmp_path)
    losses = [r["loss"] for r in loss_records(out)]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    # LoRA's B starts at 0, so step 1 is the NF4-quantised base model: close to, not equal to, the fp32 loss
    base_loss = _base_first_loss(tiny_assets)
    assert losses[0] == pytest.approx(base_loss, abs=0.05) and losses[0] != base_loss
    merged = load_file(out / "step_3" / "model.safetensors")
    base = load_file(tiny_assets / "llama" / "model.safetensors")
    assert merged.keys() == base.keys()
    assert all(merged[k].dtype == torch.float32 and merged[k].shape == base[k].shape for k in base)

    # by value, recomputed from the saved PEFT adapter and torchao's NF4 round trip of the original weight (blocks
    # of 64, block scales double-quantised in the groups tune picks for the shape: 256 at real sizes, smaller for
    # these tiny weights so that FSDP can split them): W' = deq(nf4(W)) + (alpha / r) * B @ A
    import json

    from torchao.quantization import to_nf4

    from tune.modules.peft import nf4_block_sizes

    adapter_dir = out / "step_3" / "adapter"
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scaling = adapter_config["lora_alpha"] / adapter_config["r"]  # 16 / 8 in lora_tiny.yaml
    assert scaling == 2.0
    adapter = load_file(adapter_dir / "adapter_model.safetensors")
    num_adapted = 0
    for key, weight in base.items():
        if not any(f".{name}." in key for name in HF_TARGETS):
            assert torch.equal(merged[key], weight), key  # not adapted, not quantised: the base weight as it was
            continue
        prefix = "base_model.model." + key.removesuffix(".weight")
        lora_a, lora_b = adapter[f"{prefix}.lora_A.weight"], adapter[f"{prefix}.lora_B.weight"]
        assert lora_b.abs().max() > 0, key  # B moved away from its zero init: the merge is not a no-op
        nf4 = to_nf4(weight, *nf4_block_sizes(weight.shape))
        expected = nf4.get_original_weight() + scaling * lora_b @ lora_a
        torch.testing.assert_close(merged[key], expected, atol=1e-6, rtol=1e-6, msg=key)
        # the NF4 round trip is visible: the merge used the quantised base, not the fp32 one
        assert not torch.allclose(merged[key], weight + scaling * lora_b @ lora_a, atol=1e-4, rtol=0), key
        num_adapted += 1
    assert num_adapted == 2 * len(HF_TARGETS)  # 2 layers


def test_resume_with_adapter_only_saves(tiny_assets, tmp_path):
    common = ["max_steps_per_epoch=4", "save_every_n_steps=2", "save_adapter_weights_only=True", "shuffle=True"]
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *common), cwd=tmp_path)
    uninterrupted = losses_by_step(out)
    assert sorted(p.name for p in out.glob("step_*")) == ["step_2", "step_4"]
    assert not list(out.rglob("model.safetensors"))  # adapter only
    assert (out / "step_2" / "adapter" / "adapter_model.safetensors").is_file()

    for name in ("step_4", "logs"):
        shutil.rmtree(out / name)
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *common, "resume_from_checkpoint=True"), cwd=tmp_path)
    resumed = losses_by_step(out)
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step
