"""Gated feed-forward block (SwiGLU / GeGLU; Shazeer, 2020, https://arxiv.org/abs/2002.05202)."""

import torch
from torch import nn

# torchtune's default, visible in the signature
_DEFAULT_ACTIVATION = nn.SiLU()


class FeedForward(nn.Module):
    """``w2(activation(w1(x)) * w3(x))``, or ``w2(activation(w1(x)))`` without an up projection.

    With ``nn.SiLU`` this is SwiGLU (Llama, Mistral, Qwen, Phi-3); with ``nn.GELU(approximate="tanh")`` GeGLU
    (Gemma). The projections are arguments so a builder can pass LoRA layers.

    Args:
        gate_proj (nn.Module): embed_dim -> hidden_dim, stored as ``w1``.
        down_proj (nn.Module): hidden_dim -> embed_dim, stored as ``w2``.
        up_proj (nn.Module | None): embed_dim -> hidden_dim, stored as ``w3``; None for an ungated MLP.
        activation (nn.Module | None): applied to the gate. Default ``nn.SiLU()`` (also for None).
    """

    def __init__(
        self,
        *,
        gate_proj: nn.Module,
        down_proj: nn.Module,
        up_proj: nn.Module | None = None,
        activation: nn.Module | None = _DEFAULT_ACTIVATION,
    ) -> None:
        super().__init__()
        self.w1 = gate_proj
        self.w2 = down_proj
        self.w3 = up_proj
        # the default instance is shared by every call: each block gets its own, so hooks stay per block
        self.activation = nn.SiLU() if activation is None or activation is _DEFAULT_ACTIVATION else activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., embed_dim] -> [..., embed_dim]."""
        hidden = self.activation(self.w1(x))
        if self.w3 is not None:
            hidden = hidden * self.w3(x)
        return self.w2(hidden)
