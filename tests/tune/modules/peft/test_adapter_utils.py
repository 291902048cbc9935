"""Adapter utilities: collect, freeze, save, merge, disable, and check loads."""

import copy

import pytest
import torch
from torch import nn

from tune.modules.peft import (
    DoRALinear,
    LoRALinear,
    apply_lora,
    disable_adapter,
    get_adapter_params,
    get_adapter_state_dict,
    get_lora_module_names,
    get_merged_lora_ckpt,
    is_nf4_tensor,
    merge_lora_weights,
    set_trainable_params,
    validate_lora_state_dict_load,
    validate_missing_and_unexpected_for_lora,
)

RANK, ALPHA = 4, 8.0


def _lora_block(tiny_block, use_dora=False, quantize_base=False):
    targets = ["q_proj", "v_proj"]
    model = apply_lora(copy.deepcopy(tiny_block), targets, RANK, ALPHA, use_dora=use_dora, quantize_base=quantize_base)
    torch.manual_seed(2)
    with torch.no_grad():
        for layer in (model.q_proj, model.v_proj):
            layer.lora_b.weight.normal_()
            if use_dora:
                layer.magnitude.mul_(1.2)
    return model


def test_get_adapter_params_and_set_trainable(tiny_block):
    model = _lora_block(tiny_block, use_dora=True)
    params = get_adapter_params(model)
    assert sorted(params) == sorted(
        f"{layer}.{name}" for layer in ("q_proj", "v_proj") for name in ("lora_a.weight", "lora_b.weight", "magnitude")
    )
    assert params["q_proj.magnitude"] is model.q_proj.magnitude
    set_trainable_params(model, ["output_proj.weight"])
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["output_proj.weight"]
    set_trainable_params(model, params)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(params)
    with pytest.raises(ValueError, match="not parameters of the model: q_proj.lora_c"):
        set_trainable_params(model, ["q_proj.lora_c"])


def test_get_adapter_state_dict(tiny_block):
    model = _lora_block(tiny_block, use_dora=True)
    adapter = get_adapter_state_dict(model.state_dict())
    assert set(adapter) == set(get_adapter_params(model))
    assert all(v.device.type == "cpu" for v in adapter.values())


@pytest.mark.parametrize("use_dora", [False, True])
def test_merge_lora_weights_restores_base_architecture(tiny_block, use_dora):
    model = _lora_block(tiny_block, use_dora=use_dora)
    x = torch.randn(4, 32)
    expected = model(x)
    from_ckpt = get_merged_lora_ckpt(model.state_dict(), rank=RANK, alpha=ALPHA)
    merged = merge_lora_weights(model)
    assert type(merged.q_proj) is nn.Linear and type(merged.v_proj) is nn.Linear
    assert merged.state_dict().keys() == tiny_block.state_dict().keys()
    torch.testing.assert_close(merged(x), expected, rtol=0, atol=1e-5)
    for key, value in merged.state_dict().items():
        torch.testing.assert_close(value, from_ckpt[key], rtol=0, atol=1e-6)
    # the merged model loads into the plain architecture with strict=True
    copy.deepcopy(tiny_block).load_state_dict(merged.state_dict())


def test_merge_lora_weights_rejects_bare_layer():
    with pytest.raises(TypeError, match="merged_weight"):
        merge_lora_weights(LoRALinear(8, 8, rank=2, alpha=4.0))


def test_get_merged_lora_ckpt_errors(tiny_block):
    state_dict = _lora_block(tiny_block).state_dict()
    with pytest.raises(ValueError, match="rank 4 but rank=8"):
        get_merged_lora_ckpt(state_dict, rank=8, alpha=ALPHA)
    with pytest.raises(ValueError, match="adapter-only"):
        get_merged_lora_ckpt(get_adapter_state_dict(state_dict), rank=RANK, alpha=ALPHA)


def test_get_merged_lora_ckpt_dequantises_qlora(tiny_block):
    model = _lora_block(tiny_block, quantize_base=True)
    assert is_nf4_tensor(model.state_dict()["q_proj.weight"])
    merged = get_merged_lora_ckpt(model.state_dict(), rank=RANK, alpha=ALPHA)
    assert not any(is_nf4_tensor(v) for v in merged.values())
    plain = copy.deepcopy(tiny_block)
    plain.load_state_dict(merged)
    x = torch.randn(4, 32)
    torch.testing.assert_close(plain(x), model(x), rtol=0, atol=1e-5)


def test_disable_adapter_gives_base_outputs_and_restores(tiny_block):
    model = _lora_block(tiny_block, use_dora=True)
    model.v_proj.disabled = True  # a layer that was already off stays off afterwards
    x = torch.randn(4, 32)
    with_adapters = model(x)
    with disable_adapter(model):
        torch.testing.assert_close(model(x), tiny_block(x), rtol=0, atol=1e-6)
    assert not model.q_proj.disabled and model.v_proj.disabled
    torch.testing.assert_close(model(x), with_adapters, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="boom"), disable_adapter(model):
        raise RuntimeError("boom")
    assert not model.q_proj.disabled
    with pytest.raises(ValueError, match="no adapter layer"), disable_adapter(tiny_block):
        pass


def _build_on_meta_and_load(tiny_block, state_dict, loaded="base"):
    with torch.device("meta"):
        model = apply_lora(copy.deepcopy(tiny_block).to("meta"), ["q_proj", "v_proj"], RANK, ALPHA)
    model.to_empty(device="cpu")
    result = model.load_state_dict(state_dict, strict=False)
    validate_lora_state_dict_load(model, result.missing_keys, result.unexpected_keys, loaded=loaded)
    return model


def test_validate_base_load(tiny_block):
    model = _build_on_meta_and_load(tiny_block, tiny_block.state_dict())
    for module in model.modules():
        if isinstance(module, (LoRALinear, DoRALinear)):
            module.initialize_parameters()
    x = torch.randn(4, 32)
    torch.testing.assert_close(model(x), tiny_block(x), rtol=0, atol=0)

    incomplete = {k: v for k, v in tiny_block.state_dict().items() if k != "q_proj.bias"}
    with pytest.raises(ValueError, match=r"1 missing base key\(s\): q_proj.bias"):
        _build_on_meta_and_load(tiny_block, incomplete)
    extra = dict(tiny_block.state_dict(), **{"k_proj.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"1 unexpected key\(s\): k_proj.weight"):
        _build_on_meta_and_load(tiny_block, extra)


def test_validate_adapter_load(tiny_block):
    trained = _lora_block(tiny_block)
    adapters = get_adapter_state_dict(trained.state_dict())
    model = apply_lora(copy.deepcopy(tiny_block), ["q_proj", "v_proj"], RANK, ALPHA)
    result = model.load_state_dict(adapters, strict=False)
    validate_lora_state_dict_load(model, result.missing_keys, result.unexpected_keys, loaded="adapter")
    x = torch.randn(4, 32)
    torch.testing.assert_close(model(x), trained(x), rtol=0, atol=0)
    partial = {k: v for k, v in adapters.items() if not k.startswith("v_proj")}
    result = model.load_state_dict(partial, strict=False)
    with pytest.raises(ValueError, match=r"2 missing adapter key\(s\): v_proj.lora_a.weight, v_proj.lora_b.weight"):
        validate_lora_state_dict_load(model, result.missing_keys, result.unexpected_keys, loaded="adapter")


def test_get_lora_module_names_lists_attention_then_mlp_then_output_without_changing_its_argument():
    attn = ["q_proj", "v_proj"]
    assert get_lora_module_names(attn, True, True) == ["q_proj", "v_proj", "w1", "w2", "w3", "output"]
    assert get_lora_module_names(attn, False, True) == ["q_proj", "v_proj", "output"]
    assert get_lora_module_names(attn, False, False) == ["q_proj", "v_proj"]
    assert attn == ["q_proj", "v_proj"]


def test_validate_missing_and_unexpected_for_lora_with_torchtune_arguments():
    args = (["q_proj", "v_proj"], True, False)
    base_ok = ["layers.0.attn.q_proj.lora_a.weight", "layers.0.mlp.w1.lora_b.weight", "layers.0.mlp.w2.magnitude"]
    lora_ok = ["layers.0.attn.q_proj.weight", "layers.0.attn.k_proj.weight", "tok_embeddings.weight"]
    validate_missing_and_unexpected_for_lora(*args, base_missing=base_ok, base_unexpected=[], lora_missing=lora_ok)
    with pytest.raises(ValueError, match="k_proj.weight"):
        validate_missing_and_unexpected_for_lora(*args, base_missing=["layers.0.attn.k_proj.weight"])
    with pytest.raises(ValueError, match="output.lora_a"):  # output has no adapter here: not a LoRA key
        validate_missing_and_unexpected_for_lora(*args, base_missing=["output.lora_a.weight"])
    with pytest.raises(ValueError, match="q_proj.lora_a"):
        validate_missing_and_unexpected_for_lora(*args, lora_missing=["layers.0.attn.q_proj.lora_a.weight"])
    with pytest.raises(ValueError, match="unexpected"):
        validate_missing_and_unexpected_for_lora(*args, base_unexpected=["extra.weight"])
    with pytest.raises(ValueError, match="unexpected"):
        validate_missing_and_unexpected_for_lora(*args, lora_unexpected=["extra.weight"])


@pytest.mark.parametrize("layer_cls", [LoRALinear, DoRALinear])
def test_quantization_kwargs_reach_torchao_and_need_quantize_base(layer_cls):
    pytest.importorskip("torchao")
    layer = layer_cls(64, 32, rank=4, alpha=8.0, quantize_base=True, block_size=32, scaler_block_size=8)
    assert (layer.weight.block_size, layer.weight.scaler_block_size) == (32, 8)
    layer.load_state_dict({"weight": torch.randn(32, 64)}, strict=False)  # a dense checkpoint weight
    assert layer.weight.block_size == 32
    with pytest.raises(ValueError, match="quantize_base"):
        layer_cls(64, 32, rank=4, alpha=8.0, block_size=32)
