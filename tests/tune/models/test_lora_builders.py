"""LoRA / DoRA / QLoRA variants of every family: fresh adapters change nothing, merged weights reproduce the
adapted model, QLoRA trains only adapters. The named lora_/qlora_ builders of every size are checked in
test_model_builders.py."""

import pytest
import torch
from torch import nn

from tests.tune.models._hf_cases import CASES, build_hf_model, padded_batch
from tune.models import from_hf
from tune.modules import get_causal_mask_from_padding_mask
from tune.modules.peft import DoRALinear, LoRALinear, is_nf4_tensor

pytest.importorskip("transformers")

ALL_ATTN = ["q_proj", "k_proj", "v_proj", "output_proj"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    paths = {}
    for case, make_config in CASES.items():
        path = tmp_path_factory.mktemp(case)
        build_hf_model(make_config()).save_pretrained(path)
        paths[case] = path
    return paths


def _forward(model):
    tokens, attention_mask, positions = padded_batch()
    mask = get_causal_mask_from_padding_mask(attention_mask.bool())
    return model(tokens, mask=mask, input_pos=positions)[attention_mask.bool()]


def _lora_kwargs(model_tied: bool, use_dora: bool = False) -> dict:
    return dict(
        lora_attn_modules=ALL_ATTN,
        apply_lora_to_mlp=True,
        apply_lora_to_output=not model_tied,
        lora_rank=4,
        lora_alpha=8.0,
        use_dora=use_dora,
    )


def _is_tied(model) -> bool:
    return not isinstance(model.output, nn.Linear | LoRALinear | DoRALinear)


def _merged_state_dict(model) -> dict[str, torch.Tensor]:
    """Base-model state dict with every adapter folded into its weight (merged_weight of tune.modules.peft)."""
    state = {k: v for k, v in model.state_dict().items() if ".lora_" not in k and not k.endswith(".magnitude")}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear | DoRALinear):
            state[f"{name}.weight"] = module.merged_weight()
    return state


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fresh_adapters_are_exact_and_merging_reproduces_adapted_model(case, use_dora, checkpoints):
    base = from_hf(checkpoints[case], dtype=torch.float32)
    tied = _is_tied(base)
    adapted = from_hf(checkpoints[case], dtype=torch.float32, **_lora_kwargs(tied, use_dora))
    num_adapted = sum(isinstance(m, LoRALinear | DoRALinear) for m in adapted.modules())
    assert num_adapted == len(adapted.layers) * 7 + (0 if tied else 1)
    with torch.no_grad():
        base_logits = _forward(base)
        assert torch.equal(_forward(adapted), base_logits)  # B = 0: the adapted model is the base model
        for module in adapted.modules():
            if isinstance(module, LoRALinear | DoRALinear):
                module.lora_b.weight.normal_(0.0, 0.02)
        adapted_logits = _forward(adapted)
        assert (adapted_logits - base_logits).abs().max() > 1e-2  # the adapters now matter
        base.load_state_dict(_merged_state_dict(adapted))
        error = (_forward(base) - adapted_logits).abs().max().item()
    print(f"{case} dora={use_dora}: merged max abs error {error:.2e}")
    assert error < 1e-5, error


@pytest.mark.parametrize("case", ["llama3_2", "phi3"])
def test_qlora_forward_backward_trains_only_adapters(case, tmp_path):
    # NF4 quantises blocks of 64 values, so every adapted weight here has a multiple of 64 elements
    sizes = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    build_hf_model(CASES[case]().__class__(**{**CASES[case]().to_dict(), **sizes})).save_pretrained(tmp_path)
    model = from_hf(tmp_path, dtype=torch.float32, **_lora_kwargs(True), quantize_base=True)
    assert is_nf4_tensor(model.layers[0].attn.q_proj.weight)
    adapter_names = {n for n, p in model.named_parameters() if ".lora_" in n}
    for name, param in model.named_parameters():
        param.requires_grad_(name in adapter_names)
    model.train()
    logits = _forward(model)
    logits.logsumexp(-1).mean().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == adapter_names
    assert all(torch.isfinite(p.grad).all() for n, p in model.named_parameters() if n in with_grad)


def test_qlora_builder_quantizes_adapted_base_weights():
    from tune.models.llama3_2 import lora_llama3_2

    model = lora_llama3_2(
        ["q_proj", "v_proj"],
        vocab_size=50,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=64,
        max_seq_len=32,
        intermediate_dim=96,
        lora_rank=4,
        quantize_base=True,
    )
    assert is_nf4_tensor(model.layers[0].attn.q_proj.weight)
    assert not is_nf4_tensor(model.layers[0].attn.k_proj.weight)  # not adapted: stays a plain linear


def test_lora_on_tied_output_is_rejected():
    from tune.models.qwen2_5 import lora_qwen2_5_0_5b

    with pytest.raises(ValueError, match="apply_lora_to_output"), torch.device("meta"):
        lora_qwen2_5_0_5b(["q_proj"], apply_lora_to_output=True)


def test_unknown_lora_module_is_rejected():
    from tune.models.llama3_2 import lora_llama3_2_1b

    with pytest.raises(ValueError, match="unknown module.*'o_proj'"), torch.device("meta"):
        lora_llama3_2_1b(["q_proj", "o_proj"])
