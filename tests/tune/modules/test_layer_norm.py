"""Fp32LayerNorm: bf16 in, statistics in fp32 (the reference: nn.LayerNorm on the fp32 input), bf16 out."""

import torch
from torch import nn

from tune.modules import Fp32LayerNorm


def test_fp32_layer_norm_normalises_in_fp32_and_returns_the_input_dtype():
    torch.manual_seed(0)
    norm = Fp32LayerNorm(16, eps=1e-6).to(torch.bfloat16)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = (torch.randn(3, 5, 16) * 40 + 300).to(torch.bfloat16)  # a large mean: bf16 statistics would be coarse
    reference = nn.LayerNorm(16, eps=1e-6)
    reference.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference(x.float()).to(torch.bfloat16))
