"""Generation with a KV cache: greedy, temperature, top-k and top-p sampling over left-padded batches."""

from tune.generation._generation import generate, generate_next_token, left_pad
from tune.generation._sampling import apply_top_k, apply_top_p, sample

# The mask and position helpers live in tune.modules; generation users find them here too.
from tune.modules import get_causal_mask_from_padding_mask, get_position_ids_from_padding_mask

__all__ = [
    "apply_top_k",
    "apply_top_p",
    "generate",
    "generate_next_token",
    "get_causal_mask_from_padding_mask",
    "get_position_ids_from_padding_mask",
    "left_pad",
    "sample",
]
