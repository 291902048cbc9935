"""tune/modules/peft/_adapter_utils.py: `get_adapter_config` (the LoRA settings a model was built with, under the
names of PEFT's adapter_config.json) and `initialize_dora_magnitudes` (DoRA's start, once base weights are in)."""

import copy

import pytest
import torch
from torch import nn

from tune.models.llama3_2 import llama3_2, lora_llama3_2
from tune.modules.peft import DoRALinear, LoRALinear, apply_lora, get_adapter_config, initialize_dora_magnitudes

TINY = dict(vocab_size=32, num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=16,
            intermediate_dim=32, tie_word_embeddings=False)  # fmt: skip


def _layers(model: nn.Module, kind: type) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, kind)}


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_the_builder_settings_are_read_from_the_layers(use_dora):
    model = lora_llama3_2(["q_proj", "v_proj"], lora_rank=4, lora_alpha=8.0, lora_dropout=0.1, use_dora=use_dora,
                          **TINY)  # fmt: skip
    assert get_adapter_config(model) == {"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.1}


def test_the_builder_defaults_are_reported():
    # lora_llama3_2's defaults: rank 8, alpha 16, no dropout (its signature)
    model = lora_llama3_2(["q_proj"], **TINY)
    assert get_adapter_config(model) == {"r": 8, "lora_alpha": 16.0, "lora_dropout": 0.0}


def test_a_model_without_adapters_raises():
    with pytest.raises(ValueError, match="the model has no LoRA/DoRA layers"):
        get_adapter_config(llama3_2(**TINY))


def test_initialize_dora_magnitudes_uses_the_loaded_base_weights(tiny_block):
    model = apply_lora(copy.deepcopy(tiny_block), ["q_proj", "v_proj"], rank=4, alpha=8.0, use_dora=True)
    dora = _layers(model, DoRALinear)
    assert sorted(dora) == ["q_proj", "v_proj"]
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # base weights loaded after the model was built, as from a checkpoint
        for layer in dora.values():
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator))
    initialize_dora_magnitudes(model)
    for name, layer in dora.items():
        # DoRA (Liu et al., 2024, eq. 2): m = ||W||_c, the norm of each output feature's weights ([out, in] rows)
        expected = layer.weight.detach().pow(2).sum(dim=1).sqrt()
        torch.testing.assert_close(layer.magnitude.detach(), expected, msg=name)


def test_initialize_dora_magnitudes_matches_peft(tiny_block):
    from peft import LoraConfig, get_peft_model

    generator = torch.Generator().manual_seed(4)
    loaded = copy.deepcopy(tiny_block)
    with torch.no_grad():
        for name in ("q_proj", "v_proj"):
            weight = getattr(loaded, name).weight
            weight.copy_(torch.randn(weight.shape, generator=generator))
    ours = apply_lora(copy.deepcopy(tiny_block), ["q_proj", "v_proj"], rank=4, alpha=8.0, use_dora=True)
    ours.load_state_dict(loaded.state_dict(), strict=False)  # the base weights only
    initialize_dora_magnitudes(ours)
    config = LoraConfig(r=4, lora_alpha=8.0, target_modules=["q_proj", "v_proj"], use_dora=True)
    theirs = get_peft_model(copy.deepcopy(loaded), config).base_model.model  # PEFT initialises from the weights
    for name in ("q_proj", "v_proj"):
        torch.testing.assert_close(
            getattr(ours, name).magnitude.detach(), getattr(theirs, name).lora_magnitude_vector["default"].weight
        )


def test_initialize_dora_magnitudes_leaves_lora_layers_alone():
    torch.manual_seed(0)
    model = lora_llama3_2(["q_proj"], apply_lora_to_mlp=True, use_dora=False, **TINY)
    lora = _layers(model, LoRALinear)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    initialize_dora_magnitudes(model)
    assert lora and all(not hasattr(m, "magnitude") for m in lora.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
