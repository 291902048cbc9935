"""tune.modules.moe (router, stacked experts, MoE block, load-balancing loss) and tune.modules.peft's LoRA experts,
against transformers' Qwen3-MoE modules given the same weights."""

import pytest
import torch
from torch import nn

from tune.modules.moe import (
    MoE,
    SwiGLUExperts,
    TopKRouter,
    load_balancing_loss,
    moe_aux_loss,
    moe_layer_pattern,
    tokens_per_expert,
)
from tune.modules.peft import LoRASwiGLUExperts, get_adapter_params, merge_lora_experts

transformers = pytest.importorskip("transformers")
qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")

DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 8, 6, 2, 20


def _hf_config(**overrides):
    kwargs = dict(
        hidden_size=DIM,
        moe_intermediate_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    kwargs.update(overrides)
    return transformers.Qwen3MoeConfig(**kwargs)


def _experts(cls=SwiGLUExperts, **kwargs) -> SwiGLUExperts:
    torch.manual_seed(0)
    return cls(DIM, HIDDEN, EXPERTS, **kwargs)


def _routing(seed: int = 1, skip_expert: int | None = 3):
    """Random tokens, weights and top-k indices; ``skip_expert`` receives no token (an empty group)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, DIM, generator=generator)
    scores = torch.randn(TOKENS, EXPERTS, generator=generator)
    if skip_expert is not None:
        scores[:, skip_expert] = -1e9
    weights, indices = torch.topk(scores.softmax(-1), TOP_K, dim=-1)
    return x, weights, indices


def test_router_matches_transformers_topk_router():
    config = _hf_config()
    reference = qwen3_moe.Qwen3MoeTopKRouter(config)
    nn.init.normal_(reference.weight)
    gate = nn.Linear(DIM, EXPERTS, bias=False)
    gate.weight.data.copy_(reference.weight.data)
    router = TopKRouter(gate, EXPERTS, TOP_K, norm_topk_prob=True)
    x = torch.randn(TOKENS, DIM)
    expected_logits, expected_weights, expected_indices = reference(x)
    logits, weights, indices = router(x)
    torch.testing.assert_close(logits, expected_logits, atol=0, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-7, rtol=0)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(weights.sum(-1), torch.ones(TOKENS))


def test_router_without_renormalisation_keeps_the_softmax_probabilities():
    router = TopKRouter(nn.Linear(DIM, EXPERTS, bias=False), EXPERTS, TOP_K, norm_topk_prob=False)
    x = torch.randn(TOKENS, DIM)
    logits, weights, indices = router(x)
    torch.testing.assert_close(weights, logits.softmax(-1).gather(-1, indices))
    assert (weights.sum(-1) < 1).all()


def test_router_rejects_k_larger_than_the_experts():
    with pytest.raises(ValueError, match="experts_per_token must be between 1 and num_experts"):
        TopKRouter(nn.Linear(DIM, EXPERTS, bias=False), EXPERTS, EXPERTS + 1)


@pytest.mark.parametrize("use_grouped_mm", [False, True])
def test_experts_match_transformers_experts(use_grouped_mm):
    experts = _experts(use_grouped_mm=use_grouped_mm)
    reference = qwen3_moe.Qwen3MoeExperts(_hf_config())
    with torch.no_grad():  # transformers fuses gate and up: [E, 2 * hidden, dim], gate rows first
        reference.gate_up_proj.copy_(torch.cat([experts.gate_proj, experts.up_proj], dim=1))
        reference.down_proj.copy_(experts.down_proj)
    x, weights, indices = _routing()
    error = (experts(x, weights, indices) - reference(x, indices, weights)).abs().max().item()
    print(f"experts (grouped_mm={use_grouped_mm}) vs transformers: max abs error {error:.2e}")
    assert error < 1e-6


def test_loop_and_grouped_paths_agree_in_outputs_and_gradients():
    results = []
    for use_grouped_mm in (False, True):
        experts = _experts(use_grouped_mm=use_grouped_mm)
        x, weights, indices = _routing()
        x.requires_grad_(True)
        weights.requires_grad_(True)
        out = experts(x, weights, indices)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out, x.grad, weights.grad, experts.gate_proj.grad, experts.down_proj.grad))
    for loop, grouped in zip(*results, strict=True):
        torch.testing.assert_close(grouped, loop, atol=1e-5, rtol=0)
    assert results[0][3][3].abs().max() == 0  # the expert that received no token gets no gradient
    assert results[0][3][0].abs().max() > 0


def test_grouped_path_names_the_alignment_it_needs():
    experts = SwiGLUExperts(DIM, 6, EXPERTS, use_grouped_mm=True)  # 6 float32 values = 24 bytes per row
    x, weights, indices = _routing()
    with pytest.raises(ValueError, match="multiple of 16.*use_grouped_mm=False"):
        experts(x, weights, indices)


def test_load_balancing_loss_matches_transformers_with_and_without_padding():
    generator = torch.Generator().manual_seed(2)
    logits = tuple(torch.randn(3 * 7, EXPERTS, generator=generator) * 2 for _ in range(3))  # 3 layers, batch 3 x 7
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, :5] = 0
    for padding in (None, mask):
        expected = qwen3_moe.load_balancing_loss_func(logits, EXPERTS, TOP_K, padding)
        actual = load_balancing_loss(list(logits), EXPERTS, TOP_K, padding)
        torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)
    # the padding rows count unless masked out
    assert not torch.allclose(
        load_balancing_loss(list(logits), EXPERTS, TOP_K, mask), load_balancing_loss(list(logits), EXPERTS, TOP_K)
    )


def test_load_balancing_loss_of_uniform_routing_is_k():
    # f_i = k / E and P_i = 1 / E for all i: E * sum_i (k / E) (1 / E) = k (Fedus et al., 2021, eq. 4)
    logits = torch.zeros(EXPERTS, EXPERTS)
    logits[torch.arange(EXPERTS), torch.arange(EXPERTS)] = 1.0  # each token prefers another expert
    logits[torch.arange(EXPERTS), (torch.arange(EXPERTS) + 1) % EXPERTS] = 0.5
    balanced = load_balancing_loss(logits, EXPERTS, TOP_K)
    torch.testing.assert_close(balanced, torch.tensor(float(TOP_K)))


def _moe(shared_expert=None) -> MoE:
    torch.manual_seed(0)
    router = TopKRouter(nn.Linear(DIM, EXPERTS, bias=False), EXPERTS, TOP_K)
    return MoE(experts=SwiGLUExperts(DIM, HIDDEN, EXPERTS), router=router, shared_expert=shared_expert)


def test_moe_block_matches_transformers_sparse_block_and_records_routing():
    moe = _moe()
    reference = qwen3_moe.Qwen3MoeSparseMoeBlock(_hf_config())
    with torch.no_grad():
        reference.gate.weight.copy_(moe.router.gate.weight)
        reference.experts.gate_up_proj.copy_(torch.cat([moe.experts.gate_proj, moe.experts.up_proj], dim=1))
        reference.experts.down_proj.copy_(moe.experts.down_proj)
    x = torch.randn(2, 5, DIM)
    torch.testing.assert_close(moe(x), reference(x), atol=1e-6, rtol=0)
    assert moe.router_logits.shape == (10, EXPERTS) and moe.router_logits.requires_grad
    assert moe.tokens_per_expert.sum().item() == 10 * TOP_K
    model = nn.Sequential(moe, _moe())
    model(x)
    counts = tokens_per_expert(model)
    assert counts.shape == (2, EXPERTS) and counts.sum().item() == 2 * 10 * TOP_K
    expected = load_balancing_loss([model[0].router_logits, model[1].router_logits], EXPERTS, TOP_K)
    aux = moe_aux_loss(model)
    torch.testing.assert_close(aux, expected)
    aux.backward()  # the loss reaches the routers' weights
    assert model[0].router.gate.weight.grad.abs().max() > 0


def test_moe_aux_loss_needs_moe_blocks_and_a_forward_pass():
    with pytest.raises(ValueError, match="no MoE block"):
        moe_aux_loss(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="forward pass"):
        moe_aux_loss(_moe())


def test_shared_expert_is_added_to_the_routed_output():
    shared = nn.Linear(DIM, DIM, bias=False)
    with_shared, without = _moe(shared), _moe()
    x = torch.randn(2, 5, DIM)
    torch.testing.assert_close(with_shared(x), without(x) + shared(x), atol=1e-6, rtol=0)


def test_layer_pattern_matches_transformers_decoder_layers():
    for step, dense in ((1, []), (2, []), (1, [0, 3]), (3, [2])):
        config = _hf_config(decoder_sparse_step=step, mlp_only_layers=dense, vocab_size=8)
        with torch.device("meta"):
            layers = qwen3_moe.Qwen3MoeModel(config).layers
        expected = [isinstance(layer.mlp, qwen3_moe.Qwen3MoeSparseMoeBlock) for layer in layers]
        assert moe_layer_pattern(4, step, dense) == expected, (step, dense)
    with pytest.raises(ValueError, match="outside the model"):
        moe_layer_pattern(4, 1, [4])


@pytest.mark.parametrize("use_grouped_mm", [False, True])
def test_lora_experts_start_as_the_base_and_equal_their_merge_after_training(use_grouped_mm):
    base = _experts(use_grouped_mm=use_grouped_mm)
    lora = _experts(LoRASwiGLUExperts, rank=4, alpha=8.0, use_grouped_mm=use_grouped_mm)
    lora.load_state_dict(base.state_dict(), strict=False)
    x, weights, indices = _routing()
    torch.testing.assert_close(lora(x, weights, indices), base(x, weights, indices), atol=0, rtol=0)  # B = 0
    assert sorted(get_adapter_params(lora)) == sorted(lora.adapter_params())
    assert not any(getattr(lora, name).requires_grad for name in ("gate_proj", "up_proj", "down_proj"))
    optimizer = torch.optim.SGD([getattr(lora, n) for n in lora.adapter_params()], lr=0.5)
    for _ in range(2):  # "training": B becomes non-zero
        optimizer.zero_grad()
        (lora(x, weights, indices) ** 2).mean().backward()
        optimizer.step()
    trained = lora(x, weights, indices)
    assert (trained - base(x, weights, indices)).abs().max() > 1e-3
    model = nn.ModuleDict({"experts": lora})
    merge_lora_experts(model)
    assert type(model["experts"]) is SwiGLUExperts
    torch.testing.assert_close(model["experts"](x, weights, indices), trained, atol=1e-5, rtol=0)
    lora.disabled = True  # the base alone
    torch.testing.assert_close(lora(x, weights, indices), base(x, weights, indices), atol=0, rtol=0)


def test_quantized_experts_load_dense_weights_as_nf4():
    pytest.importorskip("torchao")
    from tune.modules.peft import dequantize, is_nf4_tensor, to_nf4

    dense = SwiGLUExperts(64, 64, 2)
    quantized = LoRASwiGLUExperts(64, 64, 2, rank=4, alpha=8.0, quantize_base=True)
    quantized.load_state_dict(dense.state_dict(), strict=False)
    assert is_nf4_tensor(quantized.gate_proj) and quantized.gate_proj.shape == (2 * 64, 64)
    # each [E, out, in] weight is quantised as the flat [E * out, in] matrix, as to_nf4 does it alone
    for name in ("gate_proj", "up_proj", "down_proj"):
        expected = dequantize(to_nf4(getattr(dense, name).detach().reshape(-1, 64)))
        assert torch.equal(dequantize(getattr(quantized, name)), expected), name
    x = torch.randn(5, 64)
    weights, indices = torch.topk(torch.rand(5, 2), 2, dim=-1)
    out = quantized(x, weights, indices)
    assert out.shape == (5, 64) and torch.isfinite(out).all()
