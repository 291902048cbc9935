"""Layer norm computed in fp32 whatever the activation dtype."""

from typing import Any

import torch
from torch import nn


class Fp32LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that upcasts its input (and its affine parameters) to fp32 and casts the result back.

    Normalising bf16 activations in bf16 loses precision in the mean and variance; this keeps the statistics in
    fp32 and returns the input's dtype. Takes ``nn.LayerNorm``'s arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., normalized_shape]`` in any float dtype -> the same shape and dtype."""
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        out = nn.functional.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
        return out.to(x.dtype)
