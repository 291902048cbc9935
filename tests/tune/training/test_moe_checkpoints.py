"""LoRA on the stacked experts of Qwen3-MoE (``apply_lora_to_experts``) through the checkpoints: the merged
Hugging Face model, the adapter files (PEFT's, and tune's ``expert_adapter.safetensors``) and resuming.

The tiny model is tests/recipes/_family_assets.py's Qwen3-MoE (2 layers, 8 experts, 2 per token); references are
transformers' ``Qwen3MoeForCausalLM`` loading what the recipe wrote, and the uninterrupted run for the resume.
"""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes import _family_assets as assets
from tests.recipes.test_moe_recipes import write_config
from tests.recipes.utils import losses_by_step, run_recipe
from tune.modules.peft import LoRASwiGLUExperts, merge_lora_experts, merge_lora_experts_state_dict
from tune.training.checkpointing._formats import EXPERT_ADAPTER_FILE, adapter_to_peft, merge_adapter

RANK, ALPHA = 4, 8.0
EXPERT_LORA = {"apply_lora_to_experts": True}


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_ckpt_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    return assets.build_family_assets("qwen3_moe", root / "qwen3_moe")


def _experts(seed: int = 0) -> LoRASwiGLUExperts:
    torch.manual_seed(seed)
    experts = LoRASwiGLUExperts(dim=16, hidden_dim=8, num_experts=4, rank=RANK, alpha=ALPHA)
    with torch.no_grad():
        for name in experts.adapter_params():
            getattr(experts, name).normal_(0.0, 0.3)  # B is zero when fresh: a non-zero update to merge
    return experts


def test_state_dict_merge_equals_the_module_merge():
    experts = _experts()
    state = {f"layers.0.mlp.experts.{k}": v for k, v in experts.state_dict().items()}
    merged = merge_lora_experts_state_dict(state, ALPHA, RANK)
    reference = merge_lora_experts(torch.nn.Sequential(experts))[0]  # the module's own merge (merged_weights)
    assert sorted(merged) == [f"layers.0.mlp.experts.{n}" for n in ("down_proj", "gate_proj", "up_proj")]
    for name in ("gate_proj", "up_proj", "down_proj"):
        torch.testing.assert_close(merged[f"layers.0.mlp.experts.{name}"], getattr(reference, name), atol=0, rtol=0)
        assert not torch.equal(merged[f"layers.0.mlp.experts.{name}"], state[f"layers.0.mlp.experts.{name}"])
    # the checkpointers' merge (an unmerged model handed to save_checkpoint) gives the same
    from_formats = merge_adapter(state, ALPHA)
    assert from_formats.keys() == merged.keys()
    for key, value in merged.items():
        torch.testing.assert_close(from_formats[key], value, atol=0, rtol=0)
    with pytest.raises(ValueError, match="has rank 4 but rank=8"):
        merge_lora_experts_state_dict(state, ALPHA, rank=8)


def test_peft_export_leaves_the_expert_adapters_out():
    from tune.models.qwen3_moe import qwen3_moe_tune_to_hf

    experts = _experts()
    adapter = {f"layers.0.mlp.experts.{n}": getattr(experts, n) for n in experts.adapter_params()}
    adapter["layers.0.attn.q_proj.lora_a.weight"] = torch.zeros(RANK, 16)
    adapter["layers.0.attn.q_proj.lora_b.weight"] = torch.zeros(16, RANK)
    hf_config = {"num_experts": 4, "num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 16}
    weights, ranks, _ = adapter_to_peft(adapter, qwen3_moe_tune_to_hf, hf_config, lora_alpha=ALPHA)
    assert sorted(weights) == [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
    ]
    assert ranks == {"model.layers.0.self_attn.q_proj": RANK}


def _tune_model(data, step_dir, scratch):
    """tune's LoRA model built from the tiny dimensions, base weights from the input checkpoint and the adapters
    (PEFT file and expert file) the run saved, loaded through the checkpointer as a resumed run would."""
    from tune.models.qwen3_moe import lora_qwen3_moe
    from tune.modules.peft import validate_lora_state_dict_load
    from tune.training import FullModelHFCheckpointer

    dims = {**assets.tune_dims("qwen3_moe"), "mlp_only_layers": []}
    model = lora_qwen3_moe(["q_proj", "v_proj"], lora_rank=RANK, lora_alpha=ALPHA, **EXPERT_LORA, **dims).eval()
    checkpointer = FullModelHFCheckpointer(
        data / "hf", ["model.safetensors"], model_type="QWEN3_MOE", output_dir=scratch
    )
    missing, unexpected = model.load_state_dict(checkpointer.load_checkpoint()["model"], strict=False)
    validate_lora_state_dict_load(model, missing, unexpected, loaded="base")
    missing, unexpected = model.load_state_dict(checkpointer.load_adapter(step_dir), strict=False)
    validate_lora_state_dict_load(model, missing, unexpected, loaded="adapter")
    return model


@pytest.mark.integration
def test_expert_lora_saves_merges_into_hf_and_resumes_exactly(moe_assets, tmp_path):
    from transformers import AutoModelForCausalLM

    settings = dict(max_steps_per_epoch=4, save_every_n_steps=2, optimizer={"_component_": "torch.optim.AdamW"})
    settings["optimizer"].update(lr=1e-2, weight_decay=0.01, foreach=False)  # adapters that move in 4 steps
    out = tmp_path / "run"
    config = write_config(tmp_path, moe_assets, out, "lora", EXPERT_LORA, **settings)
    run_recipe("lora_finetune_single_device", config, [], cwd=tmp_path, timeout=300)
    uninterrupted = losses_by_step(out)
    assert sorted(uninterrupted) == [1, 2, 3, 4]
    final = out / "step_4"

    # the adapter files: PEFT's without the expert adapters, tune's expert file with all 2 layers x 6 of them
    peft_keys = load_file(final / "adapter" / "adapter_model.safetensors").keys()
    assert peft_keys and not any("experts" in k for k in peft_keys)
    expert_adapter = load_file(final / "adapter" / EXPERT_ADAPTER_FILE)
    assert len(expert_adapter) == 12 and all(k.endswith(("_lora_a", "_lora_b")) for k in expert_adapter)

    # the merged model: transformers loads it, its experts moved by the merged update, and it computes what
    # tune's LoRA model computes with the saved adapters
    hf = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    base = load_file(moe_assets / "hf" / "model.safetensors")
    merged = load_file(final / "model.safetensors")
    key = "model.layers.0.mlp.experts.3.down_proj.weight"
    expert_update = (merged[key] - base[key]).abs().max().item()
    tokens = torch.randint(0, hf.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf_logits = hf(input_ids=tokens).logits
        tune_logits = _tune_model(moe_assets, final, tmp_path / "scratch")(tokens)
    logits_diff = (hf_logits - tune_logits).abs().max().item()
    print(
        f"max |expert update| {expert_update:.2e}; max |logits(transformers, merged) - logits(tune)| {logits_diff:.2e}"
    )
    assert expert_update > 1e-3
    assert logits_diff < 1e-5

    # resume from step 2 (a crash afterwards: step_4 and the log gone): steps 3 and 4 as in the uninterrupted run
    shutil.rmtree(final)
    shutil.rmtree(out / "logs")
    run_recipe("lora_finetune_single_device", config, ["resume_from_checkpoint=True"], cwd=tmp_path, timeout=300)
    resumed = losses_by_step(out)
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step
    resumed_experts = load_file(final / "adapter" / EXPERT_ADAPTER_FILE)
    for name, value in expert_adapter.items():
        torch.testing.assert_close(resumed_experts[name], value, atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
@pytest.mark.integration
def test_expert_lora_on_two_ranks_saves_and_resumes_exactly(moe_assets, tmp_path):
    from tests.recipes.dist_utils import run_distributed, train_log

    settings = dict(max_steps_per_epoch=4, save_every_n_steps=2, batch_size=1, gradient_accumulation_steps=2)
    settings["optimizer"] = {"_component_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.01, "foreach": False}
    out = tmp_path / "run"
    config = write_config(tmp_path, moe_assets, out, "lora", EXPERT_LORA, **settings)
    run_distributed("lora_finetune_distributed", config, [], cwd=tmp_path)
    uninterrupted = {step: r["loss"] for step, r in train_log(out).items() if "loss" in r}
    assert sorted(uninterrupted) == [1, 2, 3, 4]
    final = out / "step_4"
    expert_adapter = load_file(final / "adapter" / EXPERT_ADAPTER_FILE)
    assert len(expert_adapter) == 12

    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    with torch.no_grad():
        logits_diff = hf(input_ids=tokens).logits - _tune_model(moe_assets, final, tmp_path / "scratch")(tokens)
    print(f"2 ranks: max |logits(transformers, merged) - logits(tune)| {logits_diff.abs().max():.2e}")
    assert logits_diff.abs().max() < 1e-5

    for path in (final, out / "dcp" / "step_4", out / "logs"):
        if path.exists():
            shutil.rmtree(path)
    run_distributed("lora_finetune_distributed", config, ["resume_from_checkpoint=True"], cwd=tmp_path)
    resumed = {step: r["loss"] for step, r in train_log(out).items() if "loss" in r}
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step
    resumed_experts = load_file(final / "adapter" / EXPERT_ADAPTER_FILE)
    for name, value in expert_adapter.items():
        torch.testing.assert_close(resumed_experts[name], value, atol=1e-6, rtol=0, msg=name)
