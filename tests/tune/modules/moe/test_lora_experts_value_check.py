"""Independent value checks of LoRA and QLoRA on stacked experts (tune/modules/peft/_lora_experts.py).

The reference is written out here, token by token and expert by expert, from the formula of LoRA (Hu et al., 2021)
on a SwiGLU expert: for a token x routed to expert e with router weight w,

    proj_e(x) = x W_e^T + (alpha / rank) * (x A_e^T) B_e^T        for proj in gate, up, down
    y += w * down_e(silu(gate_e(x)) * up_e(x))                      (Llama 4 routing: down_e(...(w * x)) instead)

with no use of the module's own merge (``lora_delta``, ``merged_weights``, ``merge_lora_experts``), its grouping of
tokens by expert, or ``grouped_linear``. For QLoRA the reference's ``W_e`` is the NF4 base dequantised by torchao
itself (``NF4Tensor.get_original_weight``), reshaped from torchao's flat 2-D storage to ``[experts, out, in]`` here.
"""

import pytest
import torch
import torch.nn.functional as F

from tune.modules.peft import LoRASwiGLUExperts

DIM, HIDDEN, NUM_EXPERTS, RANK, ALPHA, TOP_K, NUM_TOKENS = 32, 48, 4, 4, 8.0, 2, 24
ATOL = 1e-5  # fp32 sums in a different order; measured: outputs 1.6e-7, adapter gradients (~1) 6e-7


def _random_adapters(module: LoRASwiGLUExperts, seed: int) -> None:
    """Non-zero A and B (a fresh B is 0, which would hide any error in the update)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in module.adapter_params():
            param = getattr(module, name)
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def _routing(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_TOKENS, DIM, generator=gen)
    scores = torch.randn(NUM_TOKENS, NUM_EXPERTS, generator=gen)
    weights, indices = scores.softmax(dim=-1).topk(TOP_K, dim=-1)
    return x, weights, indices


def _reference(x, weights, indices, dense: dict, lora: dict, scale: float, weight_inputs: bool) -> torch.Tensor:
    """The formula of the module docstring, one token and one chosen expert at a time."""

    def project(name: str, expert: int, v: torch.Tensor) -> torch.Tensor:
        a, b = lora[f"{name}_lora_a"][expert], lora[f"{name}_lora_b"][expert]  # [rank, in], [out, rank]
        return v @ dense[name][expert].T + scale * (v @ a.T) @ b.T

    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(indices.shape[1]):
            e, w = int(indices[t, slot]), weights[t, slot]
            v = w * x[t] if weight_inputs else x[t]
            y = project("down_proj", e, F.silu(project("gate_proj", e, v)) * project("up_proj", e, v))
            out[t] += y if weight_inputs else w * y
    return out


@pytest.mark.parametrize("use_grouped_mm", [False, True])
@pytest.mark.parametrize("weight_inputs", [False, True])
def test_lora_experts_forward_and_gradients_equal_the_formula(use_grouped_mm, weight_inputs):
    torch.manual_seed(0)
    module = LoRASwiGLUExperts(DIM, HIDDEN, NUM_EXPERTS, RANK, ALPHA, use_grouped_mm=use_grouped_mm)
    module.weight_inputs = weight_inputs
    _random_adapters(module, seed=1)
    x, weights, indices = _routing(seed=2)
    assert len(indices.unique()) == NUM_EXPERTS  # every expert gets tokens

    dense = {name: getattr(module, name).detach().clone() for name in ("gate_proj", "up_proj", "down_proj")}
    lora = {name: getattr(module, name).detach().clone().requires_grad_(True) for name in module.adapter_params()}
    expected = _reference(x, weights, indices, dense, lora, ALPHA / RANK, weight_inputs)
    ours = module(x, weights, indices)
    base_only = _reference(x, weights, indices, dense, {k: torch.zeros_like(v) for k, v in lora.items()}, 0.0, False)
    effect = (expected - base_only).abs().max()
    print(f"forward max |ours - formula| {(ours - expected).abs().max():.3g}, adapter effect {effect:.3g}")
    assert effect > 0.1  # the adapters change the output far beyond the tolerance
    torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)

    # the adapters' gradients: the same loss through the module and through the formula
    probe = torch.randn(NUM_TOKENS, DIM, generator=torch.Generator().manual_seed(3))
    (ours * probe).sum().backward()
    (expected * probe).sum().backward()
    for name, reference in lora.items():
        grad = getattr(module, name).grad
        print(f"{name}: max |grad - formula's| {(grad - reference.grad).abs().max():.3g}")
        torch.testing.assert_close(grad, reference.grad, rtol=1e-5, atol=ATOL, msg=name)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert getattr(module, name).grad is None  # the base is frozen


def test_qlora_experts_forward_equals_dequantised_dense_experts():
    from torchao.quantization import to_nf4  # noqa: F401  (the same torchao the module quantises with)

    torch.manual_seed(0)
    dense_module = LoRASwiGLUExperts(DIM, HIDDEN, NUM_EXPERTS, RANK, ALPHA)
    checkpoint = {name: getattr(dense_module, name).detach().clone() for name in ("gate_proj", "up_proj", "down_proj")}
    module = LoRASwiGLUExperts(DIM, HIDDEN, NUM_EXPERTS, RANK, ALPHA, quantize_base=True)
    module.load_state_dict({**module.state_dict(), **checkpoint})  # a dense checkpoint is quantised on load
    _random_adapters(module, seed=1)
    x, weights, indices = _routing(seed=2)

    dense = {}
    for name, original in checkpoint.items():
        stored = getattr(module, name)
        assert type(stored).__name__ == "NF4Tensor" and tuple(stored.shape) == (
            NUM_EXPERTS * original.shape[1],
            original.shape[2],
        )
        dense[name] = stored.get_original_weight().float().reshape(original.shape)  # torchao's own dequantisation
        error = (dense[name] - original).abs().max() / original.abs().max()
        print(f"{name}: NF4 max error {error:.3g} of the largest weight")
        assert 0 < error < 0.2  # really quantised, and from these weights (16 levels, the largest gap ~0.3)
    lora = {name: getattr(module, name).detach() for name in module.adapter_params()}
    expected = _reference(x, weights, indices, dense, lora, ALPHA / RANK, weight_inputs=False)
    ours = module(x, weights, indices)
    print(f"QLoRA forward max |ours - formula on dequantised experts| {(ours - expected).abs().max():.3g}")
    torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)
    # and the NF4 base is not the dense one: the same formula on the original weights differs
    on_original = _reference(x, weights, indices, checkpoint, lora, ALPHA / RANK, weight_inputs=False)
    assert (on_original - expected).abs().max() > 10 * ATOL
