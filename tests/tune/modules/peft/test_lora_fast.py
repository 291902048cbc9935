"""LoRALinear's fast path (tune/modules/peft/_lora_fast.py) against the formula as LoRALinear.forward writes it."""

import pytest
import torch
from torch import nn

from tune.modules.peft import LoRALinear, _lora_fast
from tune.modules.peft._lora_fast import _FrozenBaseLoRAFunction

RANK, ALPHA = 4, 8.0


def _layer(**kwargs) -> LoRALinear:
    torch.manual_seed(0)
    layer = LoRALinear(64, 96, rank=RANK, alpha=ALPHA, **kwargs)
    nn.init.normal_(layer.lora_b.weight)  # B = 0 would hide every mistake in B's product
    return layer


def _count_fast_calls(monkeypatch) -> list[int]:
    calls = []
    real = _lora_fast.lora_linear

    def counted(*tensors):
        calls.append(1)
        return real(*tensors)

    monkeypatch.setattr(_lora_fast, "lora_linear", counted)
    return calls


def _run(layer: LoRALinear, x: torch.Tensor, target: torch.Tensor, use_fast_path: bool) -> list[torch.Tensor]:
    """Output and gradients (adapters, trainable base, input) of one forward/backward, with a fixed dropout seed."""
    layer.use_fast_path = use_fast_path
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(x.requires_grad)
    torch.manual_seed(5)
    out = layer(x)
    ((out - target) ** 2).sum().backward()
    trainable = [p.grad for p in layer.parameters() if p.requires_grad]
    return [out.detach(), *trainable, x.grad]


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
@pytest.mark.parametrize("input_grad", [True, False])
@pytest.mark.parametrize("base", ["frozen", "nf4", "trainable"])
def test_fast_path_equals_plain_formula(monkeypatch, use_bias, dropout, input_grad, base):
    # frozen and nf4 run the hand-written backward, trainable the fused forward with autograd's backward
    layer = _layer(use_bias=use_bias, dropout=dropout, quantize_base=base == "nf4").train()
    if base == "trainable":
        layer.weight.requires_grad_(True)
        if use_bias:
            layer.bias.requires_grad_(True)
    x = torch.randn(3, 7, 64, requires_grad=input_grad)
    target = torch.randn(3, 7, 96)
    calls = _count_fast_calls(monkeypatch)
    fast = _run(layer, x, target, use_fast_path=True)
    assert calls == [1]
    plain = _run(layer, x, target, use_fast_path=False)
    assert calls == [1]  # forcing the plain path skips _lora_fast
    assert len(fast) == len(plain)
    for got, want in zip(fast, plain):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_frozen_base_runs_the_hand_written_backward():
    layer = _layer()
    out = layer(torch.randn(2, 64))  # [n, out_dim] viewed back to the input's leading shape
    nodes = [out.grad_fn] + [node for node, _ in out.grad_fn.next_functions]
    assert "_FrozenBaseLoRAFunctionBackward" in [type(node).__name__ for node in nodes]


@pytest.mark.parametrize("same_input", [True, False])
def test_hand_written_backward_passes_gradcheck(same_input):
    # float64 finite differences against the backward of _FrozenBaseLoRAFunction; with dropout the adapter reads
    # its own (dropped) input, which gets its own gradient
    generator = torch.Generator().manual_seed(0)

    def rand(*shape, grad=True):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_(grad)

    x = rand(5, 6)
    dropped = None if same_input else rand(5, 6)
    weight, bias = rand(4, 6, grad=False), rand(4, grad=False)
    lora_a, lora_b = rand(3, 6), rand(4, 3)
    assert torch.autograd.gradcheck(
        _FrozenBaseLoRAFunction.apply, (x, dropped, weight, bias, lora_a, lora_b, 0.7), eps=1e-6, atol=1e-6
    )


def test_supports_only_plain_bias_free_adapters():
    layer = _layer()
    assert _lora_fast.supports(layer.lora_a, layer.lora_b)
    hooked = _layer()
    hooked.lora_b.register_forward_hook(lambda module, args, out: None)
    assert not _lora_fast.supports(hooked.lora_a, hooked.lora_b)
    with_bias = _layer()
    with_bias.lora_a = nn.Linear(64, RANK)
    assert not _lora_fast.supports(with_bias.lora_a, with_bias.lora_b)
    replaced = _layer()
    replaced.lora_b = nn.Sequential(nn.Linear(RANK, 96, bias=False))
    assert not _lora_fast.supports(replaced.lora_a, replaced.lora_b)


def test_kernel_takes_tensors_and_equals_the_written_formula():
    # the kernel sees no layer: plain tensors in, x W^T + b + s (dropped A^T) B^T out, for a trainable base too
    generator = torch.Generator().manual_seed(0)
    x, dropped = torch.randn(5, 6, generator=generator), torch.randn(5, 6, generator=generator)
    weight, bias = torch.randn(4, 6, generator=generator), torch.randn(4, generator=generator)
    lora_a, lora_b = torch.randn(3, 6, generator=generator), torch.randn(4, 3, generator=generator)
    for trainable in (False, True):
        base = weight.clone().requires_grad_(trainable)
        for adapter_input in (None, dropped):
            got = _lora_fast.lora_linear(x, adapter_input, base, bias, lora_a, lora_b, 0.5)
            read = x if adapter_input is None else adapter_input
            want = x @ weight.t() + bias + 0.5 * (read @ lora_a.t()) @ lora_b.t()
            torch.testing.assert_close(got, want)


def test_unsupported_adapters_take_the_plain_formula(monkeypatch):
    layer = _layer()
    layer.lora_b.register_forward_hook(lambda module, args, out: None)
    calls = _count_fast_calls(monkeypatch)
    layer(torch.randn(2, 64))
    assert calls == []


def test_compiled_layer_takes_the_written_formula_with_the_same_gradients(monkeypatch):
    # under torch.compile the written formula runs (inductor fuses it): torch 2.11's tracing of the hand-written
    # backward lost the adapters' gradients, so compiled LoRA trained almost nothing on a GPU
    eager, compiled = _layer(), _layer()
    calls = _count_fast_calls(monkeypatch)
    compiled.compile(backend="eager")  # dynamo traces the layer; no inductor needed to see which path it takes
    x = torch.randn(3, 64)
    outputs = [layer(x) for layer in (eager, compiled)]
    assert calls == [1]  # the eager layer's call only
    for out in outputs:
        out.pow(2).sum().backward()
    torch.testing.assert_close(outputs[1], outputs[0])
    for name in ("lora_a.weight", "lora_b.weight"):
        eager_grad, compiled_grad = (dict(m.named_parameters())[name].grad for m in (eager, compiled))
        assert compiled_grad is not None and compiled_grad.abs().sum() > 0, name
        torch.testing.assert_close(compiled_grad, eager_grad)
