"""The fast path of ``LoRALinear``: the same formula, with a fused forward and (frozen base) a hand-written backward.

What it computes: ``LoRALinear``'s formula, ``y = x W^T + b + s * (dropout(x) A^T) B^T`` with ``s = alpha / rank``.
It agrees with the formula as ``LoRALinear.forward`` writes it up to float32 rounding (the sums run in another
order), outputs and gradients alike; ``tests/tune/modules/peft/test_lora_fast.py`` compares the two. Setting
``use_fast_path = False`` on a layer runs the written formula instead.

Why it is faster (the timings are in benchmarks/README.md, "Figures behind the code"):

- Forward: the scaling multiplies the ``[n, rank]`` adapter activations rather than an ``[n, out_dim]`` tensor,
  and ``B``'s product accumulates into the base output with one in-place ``addmm_``: no ``[n, out_dim]``
  temporaries for the update, its scaling or the sum.
- Backward, frozen base (``_FrozenBaseLoRAFunction``): autograd's backward of that forward computes ``B``'s
  gradient as ``grad^T @ update``, a product over a transposed ``[out_dim, n]`` view that MKL runs far below its
  rate, where ``(update^T @ grad)^T``, the order used here, runs at full rate. It also returns the input gradients
  of the base and the adapter as two ``[n, in_dim]`` tensors that are then summed; here, without dropout (both
  paths read the same input), the adapter's accumulates into the base's with one ``addmm_``.

The functions take tensors (the input, the adapter's dropped input, the weights, the scaling), never the layer:
``LoRALinear.forward`` flattens its input, applies its dropout and calls :func:`lora_linear`.

When it applies (:func:`supports`, and outside ``torch.compile``, which fuses the written formula on its own): both
adapters are bias-free ``nn.Linear`` modules without hooks, holding plain tensors, because the fast path reads their
weights instead of calling them (a hook, a replaced module or a tensor-parallel DTensor shard must see its module
called). The hand-written backward further needs a frozen base (weight and bias without gradients, as in LoRA
training) stored as a plain tensor or in NF4 (QLoRA: the input gradient goes through the dequantised weight, as
torchao's NF4 linear computes it). A trainable base (gradual unfreezing) or another weight subclass gets the fused
forward with autograd's backward.
"""

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft._nf4 import dequantize, is_nf4_tensor

_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


def supports(lora_a: nn.Module, lora_b: nn.Module) -> bool:
    """Whether :func:`lora_linear` can stand in for calling the adapters: both are plain bias-free ``nn.Linear``.

    Args:
        lora_a (nn.Module): the down projection (``in_dim -> rank``).
        lora_b (nn.Module): the up projection (``rank -> out_dim``).

    Returns:
        bool: True when the fast path may read their weights instead of calling them.
    """
    return _is_plain_linear(lora_a) and _is_plain_linear(lora_b)


def lora_linear(
    x: torch.Tensor,
    dropped: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """``x W^T + b + scaling * (dropped A^T) B^T``, computed the fast way; see the module docstring.

    Args:
        x (torch.Tensor): the input, ``[n, in_dim]``.
        dropped (torch.Tensor | None): the adapter's input after dropout, ``[n, in_dim]``; None when dropout left
            ``x`` itself (no dropout, or eval mode), so that the two paths share one input.
        weight (torch.Tensor): the base weight ``W``, ``[out_dim, in_dim]``, plain or NF4.
        bias (torch.Tensor | None): the base bias ``b``, ``[out_dim]``.
        lora_a (torch.Tensor): ``A``, ``[rank, in_dim]``.
        lora_b (torch.Tensor): ``B``, ``[out_dim, rank]``.
        scaling (float): ``alpha / rank``.

    Returns:
        torch.Tensor: ``[n, out_dim]``.
    """
    if _frozen_plain_or_nf4_base(weight, bias):
        return _FrozenBaseLoRAFunction.apply(x, dropped, weight, bias, lora_a, lora_b, scaling)
    out = F.linear(x, weight, bias)  # [n, out_dim], a fresh tensor no backward needs
    update = F.linear(x if dropped is None else dropped, lora_a) * scaling  # [n, rank]
    out.addmm_(update, lora_b.t())
    return out


def _is_plain_linear(module: nn.Module) -> bool:
    """A bias-free ``nn.Linear`` without hooks whose weight is a plain tensor (not a DTensor or another subclass)."""
    return (
        type(module) is nn.Linear
        and module.bias is None
        and not (module._forward_hooks or module._forward_pre_hooks)
        and type(module.weight) in _PLAIN_TENSOR_TYPES
    )


def _frozen_plain_or_nf4_base(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
    return frozen and (type(weight) in _PLAIN_TENSOR_TYPES or is_nf4_tensor(weight))


class _FrozenBaseLoRAFunction(torch.autograd.Function):
    """``x W^T + b + scaling * (dropped A^T) B^T`` for a frozen ``W`` and ``b``, with its backward written out.

    Saved for backward: the weights, the adapter's input and the ``[n, rank]`` scaled update, as autograd would
    save them; an NF4 ``W`` stays quantised until backward needs it for the input gradient.
    """

    @staticmethod
    def forward(ctx, x, dropped, weight, bias, lora_a, lora_b, scaling):
        # x, dropped: [n, in_dim]; weight: [out_dim, in_dim]; lora_a: [rank, in_dim]; lora_b: [out_dim, rank].
        # dropped is the adapter's input after dropout, None without dropout: the same tensor passed twice would
        # stop torch.compile from tracing this function.
        ctx.same_input = dropped is None
        dropped = x if dropped is None else dropped
        out = F.linear(x, weight, bias)  # [n, out_dim]
        update = (dropped @ lora_a.t()).mul_(scaling)  # [n, rank], scaled on the small side
        out.addmm_(update, lora_b.t())
        ctx.quantized = type(weight) not in _PLAIN_TENSOR_TYPES  # NF4; decided here, where dynamo can trace it
        ctx.scaling = scaling
        ctx.save_for_backward(weight, lora_a, lora_b, dropped, update)
        return out

    @staticmethod
    def backward(ctx, grad):
        weight, lora_a, lora_b, dropped, update = ctx.saved_tensors
        dense = dequantize(weight) if ctx.quantized else weight
        needs_x, needs_dropped = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_x = grad_dropped = grad_a = grad_b = None
        grad_update = (grad @ lora_b).mul_(ctx.scaling)  # [n, rank]: d loss / d (dropped A^T), scaled
        if ctx.needs_input_grad[5]:
            grad_b = (update.t() @ grad).t().contiguous()  # [out_dim, rank], the fast way round
        if ctx.needs_input_grad[4]:
            grad_a = grad_update.t() @ dropped  # [rank, in_dim]
        if ctx.same_input:
            if needs_x:
                grad_x = (grad @ dense).addmm_(grad_update, lora_a)  # both paths in one [n, in_dim] tensor
        else:
            if needs_x:
                grad_x = grad @ dense
            if needs_dropped:
                grad_dropped = grad_update @ lora_a
        return grad_x, grad_dropped, None, None, grad_a, grad_b, None
