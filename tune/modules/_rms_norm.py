"""Root-mean-square layer normalisation (Zhang and Sennrich, 2019, https://arxiv.org/abs/1910.07467)."""

import torch
from torch import nn


class _RMSNormFunction(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2) + eps))`` for float32/float64 inputs, with a hand-written backward.

    Forward and backward give the same values, bit for bit, as autograd through the composed ops (the backward
    performs autograd's own products and sums in its order), but the only activations kept are ``x`` and the
    per-row ``1 / rms`` ([..., 1]): autograd would also keep the normalised ``x`` for the weight gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):  # noqa: D102 (see the class docstring)
        inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))  # [..., 1]
        ctx.save_for_backward(x, weight, inv_rms)
        return (x * inv_rms).mul_(weight)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        x, weight, inv_rms = ctx.saved_tensors
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_out * (x * inv_rms)).reshape(-1, x.shape[-1]).sum(0)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_normed = grad_out * weight
            grad_inv_rms = (grad_normed * x).sum(-1, keepdim=True)
            grad_mean_square = -0.5 * grad_inv_rms * inv_rms.pow(3)  # d rsqrt(v) / dv = -v^(-3/2) / 2
            # d mean(x^2) / dx = 2 x / dim; both paths into x summed, as autograd sums them
            grad_x = (grad_normed * inv_rms).add_(x * (grad_mean_square / x.shape[-1] * 2))
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    """Normalises the last dimension by its root mean square, then scales it by a learned weight.

    The statistics are computed in float32 whatever the input dtype, as Hugging Face does, so bf16 models match.

    Args:
        dim (int): size of the normalised (last) dimension.
        eps (float): added to the mean square before the square root, for numerical stability. Default 1e-6.
        add_unit_offset (bool): Gemma's variant: scale by ``1 + weight`` (computed in float32) with ``weight``
            initialised to zeros, instead of by ``weight`` initialised to ones. Default False.
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, add_unit_offset: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.add_unit_offset = add_unit_offset
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialises ``weight`` (ones, or zeros with ``add_unit_offset``)."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.add_unit_offset else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalises ``x`` [..., dim] and returns a tensor of the same shape and dtype."""
        if (
            not self.add_unit_offset
            and x.dtype == self.weight.dtype
            and x.dtype in (torch.float32, torch.float64)
            # compiled, the composed ops below fuse and inductor chooses what to keep; and torch 2.11's dynamo
            # traced this Function's backward with the weight's gradient dropped (zero), measured on an H100
            and not torch.compiler.is_compiling()
        ):
            return _RMSNormFunction.apply(x, self.weight, self.eps)
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.add_unit_offset:
            # Gemma multiplies in float32 before casting back
            return (normed * (1.0 + self.weight.float())).type_as(x)
        # Llama casts back to the input dtype first, then multiplies by the weight
        return self.weight * normed.type_as(x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, add_unit_offset={self.add_unit_offset}"
