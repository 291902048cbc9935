"""Root-mean-square layer normalisation (Zhang and Sennrich, 2019, https://arxiv.org/abs/1910.07467)."""

import torch
from torch import nn


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
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.add_unit_offset:
            # Gemma multiplies in float32 before casting back
            return (normed * (1.0 + self.weight.float())).type_as(x)
        # Llama casts back to the input dtype first, then multiplies by the weight
        return self.weight * normed.type_as(x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, add_unit_offset={self.add_unit_offset}"
