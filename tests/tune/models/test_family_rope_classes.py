"""torchtune's family RoPE names (Llama3ScaledRoPE in llama3_1, Phi3RotaryPositionalEmbeddings in phi3): torchtune's
constructor defaults, and the rotation written out in plain PyTorch (Hugging Face's rotate-half layout)."""

import torch

from tune.models.llama3_1 import Llama3ScaledRoPE
from tune.models.phi3 import Phi3RotaryPositionalEmbeddings
from tune.modules import Llama3ScaledRoPE as ModuleLlama3ScaledRoPE


def _rotate_half_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    angles = positions[..., None].float() * inv_freq  # [b, s, dim / 2]
    emb = torch.cat((angles, angles), dim=-1)[:, :, None]  # [b, s, 1, dim]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * emb.cos() + rotated * emb.sin()


def test_phi3_rope_is_rotate_half_with_torchtune_defaults():
    rope = Phi3RotaryPositionalEmbeddings(16)
    assert (rope.max_seq_len, rope.base) == (4096, 10_000)  # torchtune's defaults
    x = torch.randn(2, 5, 3, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    inv_freq = 1.0 / 10_000 ** (torch.arange(0, 16, 2).float() / 16)
    torch.testing.assert_close(rope(x, input_pos=positions), _rotate_half_reference(x, positions, inv_freq))


def test_llama3_scaled_rope_has_torchtune_defaults_and_the_module_values():
    rope = Llama3ScaledRoPE(16)
    assert (rope.max_seq_len, rope.base) == (4096, 10_000)  # torchtune's; tune.modules' defaults are Llama 3.1's
    same = ModuleLlama3ScaledRoPE(16, max_seq_len=4096, base=10_000.0)
    x = torch.randn(1, 6, 2, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rope(x), same(x), rtol=0, atol=0)
    assert isinstance(rope, ModuleLlama3ScaledRoPE)
