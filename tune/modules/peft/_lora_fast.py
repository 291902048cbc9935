"""The fast path of ``LoRALinear``: the same formula, with a fused forward and (frozen base) a hand-written backward.

What it computes: ``LoRALinear``'s formula, ``y = x W^T + b + s * (dropout(x) A^T) B^T`` with ``s = alpha / rank``.
It agrees with the formula as ``LoRALinear.forward`` writes it up to float32 rounding (the sums run in another
order), outputs and gradients alike; ``tests/tune/modules/peft/test_lora_fast.py`` compares the two. Setting
``use_fast_path = False`` on a layer runs the written formula instead.

Why it is faster (measured on CPU, where the benchmarks run; the products are the same on any device):

- Forward (commit a17c648): the scaling multiplies the ``[n, rank]`` adapter activations rather than an
  ``[n, out_dim]`` tensor, and ``B``'s product accumulates into the base output with one in-place ``addmm_``: no
  ``[n, out_dim]`` temporaries for the update, its scaling or the sum.
- Backward, frozen base (``_FrozenBaseLoRAFunction``, commit 7086921): autograd's backward of that forward
  computes ``B``'s gradient as ``grad^T @ update``, a product over a transposed ``[out_dim, n]`` view that MKL runs
  at a tenth of its rate (2048 x 1720 x 8: 8 ms, against 0.8 ms for ``(update^T @ grad)^T``, the order used
  here). It also returns the input gradients of the base and the adapter as two ``[n, in_dim]`` tensors that are
  then summed; here, without dropout (both paths read the same input), the adapter's accumulates into the base's
  with one ``addmm_``. LoRA on every linear layer of the benchmark's medium model: 2.44 -> 2.18 s per packed step.

When it applies (:func:`supports`): both adapters are bias-free ``nn.Linear`` modules without hooks, holding plain
tensors, because the fast path reads their weights instead of calling them (a hook, a replaced module or a
tensor-parallel DTensor shard must see its module called). The hand-written backward further needs a frozen base
(weight and bias without gradients, as in LoRA training) stored as a plain tensor or in NF4 (QLoRA: the input
gradient goes through the dequantised weight, as torchao's NF4 linear computes it). A trainable base (gradual
unfreezing) or another weight subclass gets the fused forward with autograd's backward.
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft._nf4 import dequantize, is_nf4_tensor

if TYPE_CHECKING:
    from tune.modules.peft._lora import LoRALinear

_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


def supports(layer: "LoRALinear") -> bool:
    """Whether :func:`lora_linear` can compute ``layer``: its adapters are plain bias-free ``nn.Linear`` modules."""
    return _is_plain_linear(layer.lora_a) and _is_plain_linear(layer.lora_b)


def lora_linear(layer: "LoRALinear", x: torch.Tensor) -> torch.Tensor:
    """``layer``'s output for ``x`` [..., in_dim], computed the fast way; see the module docstring."""
    flat_x = x.reshape(-1, layer.in_dim)  # [n, in_dim]
    if _frozen_plain_or_nf4_base(layer):
        dropped = layer.dropout(flat_x)
        out = _FrozenBaseLoRAFunction.apply(
            flat_x,
            None if dropped is flat_x else dropped,
            layer.weight,
            layer.bias,
            layer.lora_a.weight,
            layer.lora_b.weight,
            layer.scaling,
        )
    else:
        out = F.linear(flat_x, layer.weight, layer.bias)  # [n, out_dim], a fresh tensor no backward needs
        update = F.linear(layer.dropout(flat_x), layer.lora_a.weight) * layer.scaling  # [n, rank]
        out.addmm_(update, layer.lora_b.weight.t())
    return out.view(*x.shape[:-1], layer.out_dim)


def _is_plain_linear(module: nn.Module) -> bool:
    """A bias-free ``nn.Linear`` without hooks whose weight is a plain tensor (not a DTensor or another subclass)."""
    return (
        type(module) is nn.Linear
        and module.bias is None
        and not (module._forward_hooks or module._forward_pre_hooks)
        and type(module.weight) in _PLAIN_TENSOR_TYPES
    )


def _frozen_plain_or_nf4_base(layer: "LoRALinear") -> bool:
    frozen = not layer.weight.requires_grad and (layer.bias is None or not layer.bias.requires_grad)
    return frozen and (type(layer.weight) in _PLAIN_TENSOR_TYPES or is_nf4_tensor(layer.weight))


class _FrozenBaseLoRAFunction(torch.autograd.Function):
    """``x W^T + b + scaling * (dropped A^T) B^T`` for a frozen ``W`` and ``b``, with its backward written out.

    Saved for backward: the weights, the adapter's input and the ``[n, rank]`` scaled update, as autograd would
    save them; an NF4 ``W`` stays quantised until backward needs it for the input gradient.
    """

    @staticmethod
    def forward(ctx, x, dropped, weight, bias, lora_a, lora_b, scaling):
        # x, dropped: [n, in_dim]; weight: [out_dim, in_dim]; lora_a: [rank, in_dim]; lora_b: [out_dim, rank].
        # dropped is the adapter's input after dropout, None without dropout: the same tensor passed twice would
        # stop torch.compile from tracing this function (commit 5cf0e1a).
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
