import pytest
import torch

from tune.modules import RMSNorm

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_llama_rms_norm(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    x = (3 * torch.randn(2, 5, 24)).to(dtype)
    ours, reference = RMSNorm(24, eps=1e-5), LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(24))
        reference.weight.copy_(ours.weight)
    ours, reference = ours.to(dtype), reference.to(dtype)
    assert torch.equal(ours(x), reference(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unit_offset_matches_gemma2_rms_norm(dtype):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    torch.manual_seed(0)
    x = (3 * torch.randn(2, 5, 24)).to(dtype)
    ours, reference = RMSNorm(24, eps=1e-6, add_unit_offset=True), Gemma2RMSNorm(24, eps=1e-6)
    assert torch.equal(ours.weight, torch.zeros(24))  # (1 + 0) scales by one at initialisation
    with torch.no_grad():
        ours.weight.copy_(torch.randn(24))
        reference.weight.copy_(ours.weight)
    ours, reference = ours.to(dtype), reference.to(dtype)
    assert ours(x).dtype == dtype
    assert torch.equal(ours(x), reference(x))


def test_reset_parameters_after_meta_init():
    with torch.device("meta"):
        norm = RMSNorm(8)
    norm.to_empty(device="cpu")
    norm.reset_parameters()
    assert torch.equal(norm.weight, torch.ones(8))


def test_float32_backward_matches_autograd_of_the_composed_ops():
    # the fp32/fp64 path has a hand-written backward that repeats autograd's arithmetic: equal bit for bit
    torch.manual_seed(0)
    x = (3 * torch.randn(2, 5, 24)).requires_grad_(True)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24))
    grad_out = torch.randn(2, 5, 24)
    got = torch.autograd.grad(norm(x), [x, norm.weight], grad_out)
    reference = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    want = torch.autograd.grad(reference, [x, norm.weight], grad_out)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_float64_backward_passes_gradcheck():
    from tune.modules._rms_norm import _RMSNormFunction

    torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp, w: _RMSNormFunction.apply(inp, w, 1e-5), (x, weight))
