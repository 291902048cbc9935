"""A learnable tanh gate, as used for cross-attention and adapter branches (starts closed)."""

import torch
from torch import nn


class TanhGate(nn.Module):
    """Multiplies its input by ``tanh(scale)``, with one learnable scalar ``scale`` starting at 0.

    A gate that starts at 0 lets a new branch (cross-attention in Llama 3.2 Vision, Flamingo's gated layers;
    Alayrac et al., 2022, https://arxiv.org/abs/2204.14198) join a pretrained model without changing its output
    at the first step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Any shape -> the same shape, scaled by ``tanh(scale)``."""
        return x * self.scale.tanh()
