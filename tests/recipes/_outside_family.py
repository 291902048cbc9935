"""A model family from outside tune: what a user's ``my_project/components.py`` would hold.

A small GPT-2-style decoder (learned absolute positions, pre-LayerNorm blocks, fused q/k/v projection, tanh GELU
MLP) written here with its own module names, its builder, and converters from and to the Hugging Face GPT-2
checkpoint layout. Importing the module registers the family ``outside_gpt``, so a config that lists the module
under ``imports:`` can name ``model_type: OUTSIDE_GPT`` for tune's unmodified ``FullModelHFCheckpointer``.

The file uses only tune's public API and imports nothing else from the tests: tests/recipes/test_extension_points.py
copies it into a temporary folder as ``my_project/components.py`` to import it the way a user's code would be.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.registry import ModelFamily, register_model_family

FAMILY_NAME = "outside_gpt"


class OutsideBlock(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``.

    Args:
        embed_dim (int): model width.
        num_heads (int): attention heads; ``embed_dim`` must be a multiple.
        norm_eps (float): LayerNorm epsilon.
    """

    def __init__(self, embed_dim: int, num_heads: int, norm_eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.ln_2 = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.fc_in = nn.Linear(embed_dim, 4 * embed_dim)
        self.fc_out = nn.Linear(4 * embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args: ``x`` [b, s, d]; ``mask`` [b, s, s] bool (True = may attend) or None for causal. Returns [b, s, d]."""
        b, s, d = x.shape
        # [b, s, 3 * d] -> 3 x [b, n_h, s, h_d]; q, k, v are the first, second and third thirds (as in GPT-2)
        q, k, v = self.qkv(self.ln_1(x)).view(b, s, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        if mask is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.fc_out(F.gelu(self.fc_in(self.ln_2(x)), approximate="tanh"))


class OutsideGPT(nn.Module):
    """A decoder-only language model that returns logits (no ``output``/``skip_output_layer`` convention).

    Args:
        vocab_size (int): vocabulary size.
        num_layers (int): number of blocks.
        num_heads (int): attention heads per block.
        embed_dim (int): model width.
        max_seq_len (int): number of learned positions.
        norm_eps (float): LayerNorm epsilon.
    """

    def __init__(
        self, vocab_size: int, num_layers: int, num_heads: int, embed_dim: int, max_seq_len: int, norm_eps: float
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.position_embedding = nn.Embedding(max_seq_len, embed_dim)
        self.blocks = nn.ModuleList(OutsideBlock(embed_dim, num_heads, norm_eps) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.lm_head = nn.Linear(embed_dim, vocab_size, bias=False)

    def forward(
        self, tokens: torch.Tensor, *, mask: torch.Tensor | None = None, input_pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Args: ``tokens`` [b, s]; ``mask`` [b, s, s] bool or None; ``input_pos`` [b, s] or None for 0..s-1.

        Returns:
            torch.Tensor: logits [b, s, vocab_size].
        """
        if input_pos is None:
            input_pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
        x = self.token_embedding(tokens) + self.position_embedding(input_pos)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.final_norm(x))


def outside_gpt(
    vocab_size: int, num_layers: int, num_heads: int, embed_dim: int, max_seq_len: int, norm_eps: float = 1e-5
) -> OutsideGPT:
    """Builds an :class:`OutsideGPT` (the family's one builder)."""
    return OutsideGPT(vocab_size, num_layers, num_heads, embed_dim, max_seq_len, norm_eps)


# (Hugging Face GPT-2 name, ours, stored as Conv1D): GPT-2's Conv1D weights are [in, out], transposed here to
# nn.Linear's [out, in]. {n} is a block index, {p} "weight" or "bias".
_NAMES = [
    ("transformer.wte.weight", "token_embedding.weight", False),
    ("transformer.wpe.weight", "position_embedding.weight", False),
    ("transformer.h.{n}.ln_1.{p}", "blocks.{n}.ln_1.{p}", False),
    ("transformer.h.{n}.attn.c_attn.{p}", "blocks.{n}.qkv.{p}", True),
    ("transformer.h.{n}.attn.c_proj.{p}", "blocks.{n}.proj.{p}", True),
    ("transformer.h.{n}.ln_2.{p}", "blocks.{n}.ln_2.{p}", False),
    ("transformer.h.{n}.mlp.c_fc.{p}", "blocks.{n}.fc_in.{p}", True),
    ("transformer.h.{n}.mlp.c_proj.{p}", "blocks.{n}.fc_out.{p}", True),
    ("transformer.ln_f.{p}", "final_norm.{p}", False),
    ("lm_head.weight", "lm_head.weight", False),
]


def _regex(template: str) -> str:
    return re.escape(template).replace(re.escape("{n}"), r"(?P<n>\d+)").replace(re.escape("{p}"), "(?P<p>weight|bias)")


def _convert(state_dict: Mapping[str, torch.Tensor], source: int, target: int) -> dict[str, torch.Tensor]:
    converted = {}
    for key, tensor in state_dict.items():
        for names in _NAMES:
            found = re.fullmatch(_regex(names[source]), key)
            if found:
                transpose = names[2] and key.endswith("weight")
                converted[names[target].format(**found.groupdict())] = tensor.t().contiguous() if transpose else tensor
                break
        else:
            raise ValueError(f"{FAMILY_NAME}: unexpected key {key!r}; known names: {[n[source] for n in _NAMES]}")
    return converted


def hf_to_tune(state_dict: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """GPT-2 checkpoint keys -> :class:`OutsideGPT` keys (Conv1D weights transposed to ``nn.Linear``'s layout)."""
    return _convert(state_dict, source=0, target=1)


def tune_to_hf(state_dict: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """:class:`OutsideGPT` keys -> GPT-2 checkpoint keys (the inverse of :func:`hf_to_tune`)."""
    return _convert(state_dict, source=1, target=0)


register_model_family(
    ModelFamily(name=FAMILY_NAME, builders={"outside_gpt": outside_gpt}, hf_to_tune=hf_to_tune, tune_to_hf=tune_to_hf)
)
