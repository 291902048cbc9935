"""DoRALinear: magnitude initialisation, parity with Hugging Face PEFT's DoRA (forward, gradients, merge), QDoRA."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import DoRALinear, apply_lora, dequantize, get_merged_lora_ckpt, is_nf4_tensor

RANK, ALPHA = 4, 8.0


def _layer(**kwargs) -> DoRALinear:
    torch.manual_seed(0)
    return DoRALinear(64, 96, rank=RANK, alpha=ALPHA, **kwargs)


def test_keys_and_trainable_params():
    layer = _layer(use_bias=True)
    assert set(layer.state_dict()) == {"weight", "bias", "lora_a.weight", "lora_b.weight", "magnitude"}
    assert layer.adapter_params() == ["lora_a.weight", "lora_b.weight", "magnitude"]
    assert {n for n, p in layer.named_parameters() if p.requires_grad} == set(layer.adapter_params())


def test_magnitude_starts_at_row_norms_and_output_is_unchanged():
    layer = _layer(use_bias=True)
    torch.testing.assert_close(layer.magnitude, torch.linalg.norm(layer.weight, dim=1), rtol=0, atol=0)
    x = torch.randn(2, 5, 64)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_forward_formula_and_disabled():
    layer = _layer(use_bias=True)
    nn.init.normal_(layer.lora_b.weight)
    with torch.no_grad():
        layer.magnitude.mul_(1.3)
    adapted = layer.weight + (ALPHA / RANK) * layer.lora_b.weight @ layer.lora_a.weight
    direction = adapted / torch.linalg.norm(adapted, dim=1, keepdim=True)
    x = torch.randn(3, 64)
    expected = F.linear(x, layer.magnitude[:, None] * direction, layer.bias)  # DoRA paper, eq. (5)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(F.linear(x, layer.merged_weight(), layer.bias), expected, rtol=0, atol=1e-5)
    layer.disabled = True
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_initialize_dora_magnitude_after_loading():
    base = nn.Linear(64, 96)
    with torch.device("meta"):
        layer = DoRALinear(64, 96, rank=RANK, alpha=ALPHA, use_bias=True)
    layer.to_empty(device="cpu")
    layer.load_state_dict(base.state_dict(), strict=False)
    layer.initialize_parameters()
    layer.initialize_dora_magnitude()
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), base(x), rtol=0, atol=1e-6)


def test_magnitude_init_matches_peft(tiny_block):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj"], use_dora=True)
    peft_model = get_peft_model(copy.deepcopy(tiny_block), config)
    ours = apply_lora(copy.deepcopy(tiny_block), ["q_proj", "v_proj"], rank=RANK, alpha=ALPHA, use_dora=True)
    for name in ("q_proj", "v_proj"):
        theirs = getattr(peft_model.base_model.model, name).lora_magnitude_vector["default"].weight
        assert (getattr(ours, name).magnitude - theirs).abs().max() <= 1e-6


def test_peft_parity_forward_gradients_and_merge(tiny_block, make_peft_pair):
    peft_model, ours = make_peft_pair(tiny_block, use_dora=True)
    peft_model.eval(), ours.eval()
    x = torch.randn(3, 7, 32)
    theirs_out, ours_out = peft_model(x), ours(x)
    assert (theirs_out - ours_out).abs().max() <= 1e-6
    # Same gradients means the same detached weight norm (DoRA section 4.3) as PEFT.
    theirs_out.square().mean().backward()
    ours_out.square().mean().backward()
    for name in ("q_proj", "v_proj"):
        theirs, mine = getattr(peft_model.base_model.model, name), getattr(ours, name)
        pairs = [
            (mine.lora_a.weight, theirs.lora_A["default"].weight),
            (mine.lora_b.weight, theirs.lora_B["default"].weight),
            (mine.magnitude, theirs.lora_magnitude_vector["default"].weight),
        ]
        for mine_param, theirs_param in pairs:
            torch.testing.assert_close(mine_param.grad, theirs_param.grad, rtol=0, atol=1e-6)

    merged_theirs = peft_model.merge_and_unload().state_dict()
    merged_ours = get_merged_lora_ckpt(ours.state_dict(), rank=RANK, alpha=ALPHA)
    assert merged_ours.keys() == tiny_block.state_dict().keys() == merged_theirs.keys()
    for key in merged_ours:
        assert (merged_ours[key] - merged_theirs[key]).abs().max() <= 1e-6, key


def test_peft_parity_with_dropout_in_training(tiny_block, make_peft_pair):
    # With active dropout PEFT rescales the base term computed on the dropped input; DoRALinear does the same.
    peft_model, ours = make_peft_pair(tiny_block, use_dora=True, dropout=0.3)
    peft_model.train(), ours.train()
    x = torch.randn(3, 7, 32)
    torch.manual_seed(5)
    theirs_out = peft_model(x)
    torch.manual_seed(5)
    ours_out = ours(x)
    assert (theirs_out - ours_out).abs().max() <= 1e-6


@pytest.mark.parametrize("use_bias", [False, True])
def test_qdora_forward_backward_only_adapters_get_gradients(use_bias):
    layer = _layer(quantize_base=True, use_bias=use_bias)
    assert is_nf4_tensor(layer.weight)
    # the magnitude starts at the norms of the weight the forward actually uses: the dequantised one
    torch.testing.assert_close(layer.magnitude, torch.linalg.norm(dequantize(layer.weight), dim=1), rtol=0, atol=0)
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64)
    out = layer(x)
    torch.testing.assert_close(out, F.linear(x, layer.merged_weight(), layer.bias), rtol=0, atol=1e-5)
    out.square().sum().backward()
    for name in layer.adapter_params():
        assert layer.get_parameter(name).grad is not None, name
    assert layer.weight.grad is None and (layer.bias is None or layer.bias.grad is None)
