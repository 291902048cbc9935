"""LoRALinear: initialisation, the forward formula, parity with Hugging Face PEFT, and QLoRA (NF4 base weights)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import LoRALinear, dequantize, get_merged_lora_ckpt, is_nf4_tensor, to_nf4

RANK, ALPHA = 4, 8.0

# The 16 NF4 code values (QLoRA, appendix E; the table torchao uses), in units of the block's absmax.
NF4_CODE = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
]


def _layer(**kwargs) -> LoRALinear:
    torch.manual_seed(0)
    return LoRALinear(64, 96, rank=RANK, alpha=ALPHA, **kwargs)


def test_state_dict_keys_extend_nn_linear():
    layer = _layer(use_bias=True)
    linear_keys = set(nn.Linear(64, 96).state_dict())
    assert set(layer.state_dict()) == linear_keys | {"lora_a.weight", "lora_b.weight"}
    assert layer.adapter_params() == ["lora_a.weight", "lora_b.weight"]
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_a.weight", "lora_b.weight"]


def test_initialisation_kaiming_a_zero_b():
    layer = LoRALinear(256, 96, rank=8, alpha=16.0)
    assert torch.count_nonzero(layer.lora_b.weight) == 0
    # kaiming_uniform_(a=sqrt(5)): gain = sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
    bound = 1 / math.sqrt(256)
    a = layer.lora_a.weight
    assert a.abs().max() <= bound
    # 2048 uniform draws: the largest lies within 1% of the bound unless P = 0.99^2048 < 1e-8 strikes.
    assert a.abs().max() > 0.99 * bound
    assert abs(a.mean().item()) < 0.1 * bound


def test_zero_b_reproduces_base_exactly():
    layer = _layer(use_bias=True)
    x = torch.randn(2, 5, 64)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_forward_formula_and_disabled():
    layer = _layer(use_bias=True)
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64)
    update = x @ layer.lora_a.weight.T @ layer.lora_b.weight.T
    expected = F.linear(x, layer.weight, layer.bias) + (ALPHA / RANK) * update  # LoRA paper, eq. (3)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)
    layer.disabled = True
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_hooked_or_replaced_adapter_module_is_called_as_a_module():
    # the fast path reads lora_b.weight; a hook on lora_b (or a replaced lora_b) must see lora_b called instead
    layer = _layer()
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64)
    fast = layer(x)
    seen = []
    layer.lora_b.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    torch.testing.assert_close(layer(x), fast, rtol=0, atol=1e-6)
    assert seen == [(2, 5, layer.out_dim)]


def test_adapter_replaced_by_a_linear_with_bias_keeps_its_bias():
    # the fast paths read only the adapters' weights; a user's adapter Linear with a bias must be called instead
    layer = _layer()
    layer.lora_a, layer.lora_b = nn.Linear(64, RANK), nn.Linear(RANK, 96)
    x = torch.randn(2, 5, 64, requires_grad=True)
    expected = F.linear(x, layer.weight) + layer.lora_b(layer.lora_a(x)) * (ALPHA / RANK)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-5)


def test_dropout_only_touches_the_adapter_input():
    layer = _layer(dropout=0.5).train()
    x = torch.randn(4, 64)
    assert torch.equal(layer(x), F.linear(x, layer.weight))  # B = 0: dropout cannot reach the output
    nn.init.normal_(layer.lora_b.weight)
    torch.manual_seed(3)
    out = layer(x)
    torch.manual_seed(3)
    kept = nn.functional.dropout(x, p=0.5, training=True)
    expected = F.linear(x, layer.weight) + (ALPHA / RANK) * layer.lora_b(layer.lora_a(kept))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    layer.eval()
    torch.testing.assert_close(layer(x), F.linear(x, layer.merged_weight()), rtol=0, atol=1e-5)


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("input_grad", [True, False])
@pytest.mark.parametrize("quantize_base", [False, True])
def test_gradients_equal_autograd_of_the_formula(use_bias, dropout, input_grad, quantize_base):
    # the frozen-base path has a hand-written backward; autograd through eq. (3) of the LoRA paper is the reference
    # (for an NF4 base, with its dequantised weight: what torchao's NF4 linear computes with)
    layer = _layer(use_bias=use_bias, dropout=dropout, quantize_base=quantize_base).train()
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(3, 7, 64, requires_grad=input_grad)
    target = torch.randn(3, 7, 96)
    torch.manual_seed(5)
    ((layer(x) - target) ** 2).sum().backward()
    got = [layer.lora_a.weight.grad, layer.lora_b.weight.grad, x.grad]
    a, b = layer.lora_a.weight.detach().requires_grad_(), layer.lora_b.weight.detach().requires_grad_()
    ref_x = x.detach().requires_grad_(input_grad)
    torch.manual_seed(5)
    kept = F.dropout(ref_x, p=dropout, training=True)
    out = F.linear(ref_x, dequantize(layer.weight), layer.bias) + (ALPHA / RANK) * (kept @ a.T @ b.T)
    ((out - target) ** 2).sum().backward()
    assert layer.weight.grad is None and (layer.bias is None or layer.bias.grad is None)
    for g, want in zip(got, [a.grad, b.grad, ref_x.grad]):
        if want is None:
            assert g is None
        else:
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_layer_matches_eager_outputs_and_gradients(backend):
    # the hand-written backward must trace under torch.compile (dynamo, and AOTAutograd for aot_eager); these
    # backends need no C++ toolchain
    layer = _layer(use_bias=True)
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64, requires_grad=True)
    layer(x).square().sum().backward()
    want = [layer.lora_a.weight.grad.clone(), layer.lora_b.weight.grad.clone(), x.grad.clone()]
    layer.zero_grad()
    x.grad = None
    torch._dynamo.reset()
    torch.compile(layer, backend=backend, fullgraph=True)(x).square().sum().backward()
    for got, ref in zip([layer.lora_a.weight.grad, layer.lora_b.weight.grad, x.grad], want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_unfrozen_base_weight_gets_its_gradient():
    # e.g. a gradual-unfreezing schedule turning the base weight trainable
    layer = _layer(use_bias=True)
    layer.weight.requires_grad_(True)
    layer.bias.requires_grad_(True)
    x = torch.randn(5, 64)
    layer(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(96, 1) * x.sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, torch.full((96,), 5.0))


def test_merged_weight_reproduces_forward():
    layer = _layer(use_bias=True)
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(3, 64)
    torch.testing.assert_close(F.linear(x, layer.merged_weight(), layer.bias), layer(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(in_dim=64, out_dim=96, rank=0, alpha=1.0), "rank"),
        (dict(in_dim=64, out_dim=96, rank=4, alpha=1.0, dropout=1.0), "dropout"),
        (dict(in_dim=0, out_dim=96, rank=4, alpha=1.0), "in_dim"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRALinear(**kwargs)


def test_meta_device_build_then_load():
    base = nn.Linear(64, 96, bias=True)
    with torch.device("meta"):
        layer = LoRALinear(64, 96, rank=RANK, alpha=ALPHA, use_bias=True)
    layer.to_empty(device="cpu")
    result = layer.load_state_dict(base.state_dict(), strict=False)
    assert sorted(result.missing_keys) == ["lora_a.weight", "lora_b.weight"]
    layer.initialize_parameters()
    x = torch.randn(2, 64)
    assert torch.equal(layer(x), base(x))
    assert not layer.weight.requires_grad and layer.lora_a.weight.requires_grad


# ---------------------------------------------------------------- parity with Hugging Face PEFT


def test_peft_parity_forward_backward_and_merge(tiny_block, make_peft_pair):
    peft_model, ours = make_peft_pair(tiny_block, use_dora=False)
    x = torch.randn(3, 7, 32)
    theirs_out, ours_out = peft_model(x), ours(x)
    assert (theirs_out - ours_out).abs().max() <= 1e-6
    theirs_out.square().mean().backward()
    ours_out.square().mean().backward()
    for name in ("q_proj", "v_proj"):
        theirs, mine = getattr(peft_model.base_model.model, name), getattr(ours, name)
        torch.testing.assert_close(mine.lora_a.weight.grad, theirs.lora_A["default"].weight.grad, rtol=0, atol=1e-6)
        torch.testing.assert_close(mine.lora_b.weight.grad, theirs.lora_B["default"].weight.grad, rtol=0, atol=1e-6)

    merged_theirs = peft_model.merge_and_unload().state_dict()
    merged_ours = get_merged_lora_ckpt(ours.state_dict(), rank=RANK, alpha=ALPHA)
    assert merged_ours.keys() == tiny_block.state_dict().keys() == merged_theirs.keys()
    for key in merged_ours:
        assert (merged_ours[key] - merged_theirs[key]).abs().max() <= 1e-6, key


def test_peft_parity_with_dropout_in_training(tiny_block, make_peft_pair):
    peft_model, ours = make_peft_pair(tiny_block, use_dora=False, dropout=0.3)
    peft_model.train(), ours.train()
    x = torch.randn(3, 7, 32)
    # Both draw one dropout mask per adapted layer, in the same order, so the same seed gives the same masks.
    torch.manual_seed(11)
    theirs_out = peft_model(x)
    torch.manual_seed(11)
    ours_out = ours(x)
    assert (theirs_out - ours_out).abs().max() <= 1e-6


# ---------------------------------------------------------------- QLoRA: NF4 base weights through torchao


def _nf4_bytes(weight: torch.Tensor) -> int:
    inner, _ = weight.__tensor_flatten__()
    return sum(getattr(weight, name).numel() * getattr(weight, name).element_size() for name in inner)


# (257, 64) has a prime number of blocks, so its scales are double-quantised in groups of one.
@pytest.mark.parametrize("shape", [(256, 512), (257, 64)])
def test_nf4_reconstruction_error_is_within_the_quantisation_bound(shape):
    torch.manual_seed(0)
    weight = torch.randn(shape) * 0.02
    restored = dequantize(to_nf4(weight))
    assert restored.dtype == weight.dtype and restored.shape == weight.shape
    # Per 64-value block with absmax s, an exact scale gives an error of at most half the widest gap between
    # neighbouring NF4 codes times s. The block scales themselves are stored as int8 around their mean (double
    # quantisation), off by at most half a step: max|s - mean(s)| / 256 (step = 2 * absmax / 256), which moves a
    # value by at most that much (|code| <= 1).
    blocks, restored_blocks = weight.reshape(-1, 64), restored.reshape(-1, 64)
    absmax = blocks.abs().amax(dim=1)
    half_gap = max(b - a for a, b in zip(NF4_CODE, NF4_CODE[1:])) / 2
    scale_error = (absmax - absmax.mean()).abs().max() / 256
    bound = half_gap * absmax + scale_error + 1e-7
    assert ((blocks - restored_blocks).abs().amax(dim=1) <= bound).all()
    relative = (weight - restored).norm() / weight.norm()
    assert relative < 0.15  # a loose sanity check on the typical error; the bound above is the real test


def test_nf4_memory_is_about_four_bits_per_weight():
    weight = torch.randn(256, 512)
    quantized = to_nf4(weight)
    # 4 bits of code per value, one int8 scale per 64 values, one fp32 factor per 256 scales (plus a 16-entry
    # fp32 code table and a scalar mean): ~4.13 bits, i.e. < 1/7 of fp32's 32 bits.
    assert _nf4_bytes(quantized) < weight.numel() * weight.element_size() / 7
    assert is_nf4_tensor(quantized) and not is_nf4_tensor(weight)


def test_nf4_needs_multiples_of_64():
    with pytest.raises(ValueError, match="multiple of 64"):
        to_nf4(torch.randn(3, 5))


@pytest.mark.parametrize("use_bias", [False, True])
def test_qlora_forward_backward_only_adapters_get_gradients(use_bias):
    layer = _layer(quantize_base=True, use_bias=use_bias)
    assert is_nf4_tensor(layer.weight)
    nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64, requires_grad=True)
    out = layer(x)
    expected = F.linear(x, dequantize(layer.weight), layer.bias) + (ALPHA / RANK) * layer.lora_b(layer.lora_a(x))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    out.square().sum().backward()
    assert layer.lora_a.weight.grad is not None and layer.lora_b.weight.grad is not None
    assert layer.weight.grad is None and (layer.bias is None or layer.bias.grad is None)
    # the input gradient flows through the dequantised base weight as well as the adapter
    grad_expected = torch.autograd.grad(expected.square().sum(), x)[0]
    torch.testing.assert_close(x.grad, grad_expected, rtol=0, atol=1e-4)


def test_qlora_loads_dense_checkpoint_and_merges():
    base = nn.Linear(64, 96)
    layer = _layer(quantize_base=True, use_bias=True)
    layer.load_state_dict(base.state_dict(), strict=False)
    assert is_nf4_tensor(layer.weight) and not layer.weight.requires_grad
    torch.testing.assert_close(dequantize(layer.weight), dequantize(to_nf4(base.weight.detach())), rtol=0, atol=0)
    nn.init.normal_(layer.lora_b.weight)
    merged = get_merged_lora_ckpt(layer.state_dict(), rank=RANK, alpha=ALPHA)
    assert not is_nf4_tensor(merged["weight"])
    x = torch.randn(3, 64)
    torch.testing.assert_close(F.linear(x, merged["weight"], merged["bias"]), layer(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("assign", [False, True])
def test_qlora_meta_build_then_load(assign):
    base = nn.Linear(64, 96, bias=False)
    with torch.device("meta"):
        layer = LoRALinear(64, 96, rank=RANK, alpha=ALPHA, quantize_base=True)
    if not assign:
        layer.to_empty(device="cpu")
    layer.load_state_dict(base.state_dict(), strict=False, assign=assign)
    layer.lora_a.to_empty(device="cpu")
    layer.lora_b.to_empty(device="cpu")
    layer.initialize_parameters()
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), F.linear(x, dequantize(to_nf4(base.weight.detach()))), rtol=0, atol=1e-6)
