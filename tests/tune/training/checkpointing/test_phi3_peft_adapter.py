"""Phi-3 LoRA adapters in the PEFT format: Hugging Face fuses q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj`` while tune keeps them apart, so the saved adapter fuses tune's per-projection LoRAs (block-diagonal
B). The reference is PEFT itself on transformers' Phi3ForCausalLM, and the merged checkpoint tune writes."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.tune.models._hf_cases import VOCAB, build_hf_model, phi3_config
from tune.models import from_hf
from tune.training.checkpointing import ADAPTER_CONFIG, MODEL_KEY, FullModelHFCheckpointer

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

RANK, ALPHA = 4, 8.0
TOKENS = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("phi3")
    build_hf_model(phi3_config()).save_pretrained(path)
    return path


def _trained_lora_phi3(path, attn_modules, use_dora):
    model = from_hf(
        path,
        dtype=torch.float32,
        lora_attn_modules=attn_modules,
        apply_lora_to_mlp=True,
        lora_rank=RANK,
        lora_alpha=ALPHA,
        use_dora=use_dora,
    )
    torch.manual_seed(3)
    with torch.no_grad():  # "training": non-zero B (and A, magnitudes) away from their initialisation
        for name, param in model.named_parameters():
            if ".lora_" in name or name.endswith("magnitude"):
                param.add_(0.05 * torch.randn_like(param))
    return model.eval()


def _hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")


@pytest.mark.parametrize(
    "attn_modules, use_dora",
    [
        (["q_proj", "k_proj", "v_proj"], False),
        (["q_proj", "v_proj", "output_proj"], False),
        (["q_proj", "k_proj", "v_proj"], True),
    ],
    ids=["qkv", "qv-zero-block", "dora"],
)
def test_phi3_adapter_loads_in_peft_and_back_into_tune(phi3_dir, tmp_path, attn_modules, use_dora):
    ckpt = FullModelHFCheckpointer(phi3_dir, model_type="phi3", output_dir=tmp_path / "out")
    ckpt.load_checkpoint()
    model = _trained_lora_phi3(phi3_dir, attn_modules, use_dora)
    out = ckpt.save_checkpoint(
        {MODEL_KEY: model.state_dict(), ADAPTER_CONFIG: {"r": RANK, "lora_alpha": ALPHA}}, step=1
    )

    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    expected_targets = {"qkv_proj", "gate_up_proj", "down_proj"} | (
        {"o_proj"} if "output_proj" in attn_modules else set()
    )
    assert set(config["target_modules"]) == expected_targets
    assert config["rank_pattern"]["model.layers.0.self_attn.qkv_proj"] == 3 * RANK  # three rank-r LoRAs side by side
    assert config["alpha_pattern"]["model.layers.0.self_attn.qkv_proj"] == 3 * ALPHA  # keeps scaling alpha / r
    assert config["rank_pattern"]["model.layers.1.mlp.gate_up_proj"] == 2 * RANK

    with torch.no_grad():
        ours = model(TOKENS)
        peft_model = peft.PeftModel.from_pretrained(_hf_model(phi3_dir), out / "adapter").eval()
        peft_logits = peft_model(TOKENS).logits
        merged_logits = _hf_model(out).eval()(TOKENS).logits
    base_logits = _hf_model(phi3_dir).eval()(TOKENS).logits.detach()
    assert (peft_logits - base_logits).abs().max() > 1e-2  # the adapter matters
    torch.testing.assert_close(peft_logits, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(peft_logits, merged_logits, rtol=1e-5, atol=1e-5)

    # back into tune's per-projection adapters (resume, generate / eleuther_eval with adapter_checkpoint)
    loaded = ckpt.load_adapter(out)
    expected = {k: v for k, v in model.state_dict().items() if ".lora_" in k or k.endswith("magnitude")}
    assert sorted(loaded) == sorted(expected)  # k_proj had no LoRA in "qv-zero-block": none comes back
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def _fused_only_adapter(phi3_dir, tmp_path, rank, block_diagonal):
    """An adapter PEFT itself made on qkv_proj (not written by tune)."""
    config = peft.LoraConfig(r=rank, lora_alpha=ALPHA, target_modules=["qkv_proj"], init_lora_weights=False)
    peft_model = peft.get_peft_model(_hf_model(phi3_dir), config)
    peft_model.save_pretrained(tmp_path / "peft")
    weights = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    if block_diagonal:  # zero lora_B outside the q/k/v diagonal blocks: exactly three LoRAs of rank / 3
        for key, value in weights.items():
            if key.endswith("lora_B.weight"):
                mask = torch.zeros_like(value)
                for i, (start, stop) in enumerate([(0, 60), (60, 80), (80, 100)]):
                    mask[start:stop, i * rank // 3 : (i + 1) * rank // 3] = 1
                weights[key] = value * mask
        save_file(weights, tmp_path / "peft" / "adapter_model.safetensors")
    return peft_model, tmp_path / "peft"


def test_peft_made_block_diagonal_adapter_loads_exactly(phi3_dir, tmp_path):
    _, adapter_dir = _fused_only_adapter(phi3_dir, tmp_path, rank=6, block_diagonal=True)
    ckpt = FullModelHFCheckpointer(phi3_dir, model_type="phi3", output_dir=tmp_path / "out")
    adapter = ckpt.load_adapter(adapter_dir)
    model = from_hf(
        phi3_dir, dtype=torch.float32, lora_attn_modules=["q_proj", "k_proj", "v_proj"], lora_rank=2, lora_alpha=ALPHA
    )
    missing, unexpected = model.load_state_dict(adapter, strict=False)
    assert not unexpected and not [k for k in missing if ".lora_" in k]
    with torch.no_grad():
        peft_logits = peft.PeftModel.from_pretrained(_hf_model(phi3_dir), adapter_dir).eval()(TOKENS).logits
        torch.testing.assert_close(model.eval()(TOKENS), peft_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank, block_diagonal, match", [(6, False, "block-diagonal"), (4, False, "multiple of 3")])
def test_fused_adapter_tune_cannot_split_is_refused(phi3_dir, tmp_path, rank, block_diagonal, match):
    _, adapter_dir = _fused_only_adapter(phi3_dir, tmp_path, rank, block_diagonal)
    ckpt = FullModelHFCheckpointer(phi3_dir, model_type="phi3", output_dir=tmp_path / "out")
    with pytest.raises(ValueError, match=match):
        ckpt.load_adapter(adapter_dir)
