"""Packed batches on a GPU: attention under the batch's mask through flex attention, skipping masked-out blocks.

A packed batch's block-causal mask (``[b, s, s]`` bool) given to ``F.scaled_dot_product_attention`` rules out the
flash kernel: SDPA then runs its memory-efficient kernel over every ``s x s`` score, reading the mask as a bias,
and drops those the mask removes (half of them from causality alone). Flex attention instead takes a
``BlockMask``: per 128 x 128 tile, whether it is fully masked (skipped), fully visible (no mask read) or partial
(the mask read element by element). :func:`block_mask` builds one from the dense mask itself, whatever it holds
(so the result is the masked SDPA call's, up to rounding), and ``TransformerDecoder`` builds it once per forward
and passes it to every layer in place of the dense mask.

When it applies (``TransformerDecoder._flex_mask`` decides): a CUDA device of compute capability 8.0 or newer, a
``[b, s, s]`` bool mask, training without a KV cache, and layers whose attention has no sliding window, logit
soft-capping, chunked attention or attention dropout. ``model.use_flex_attention = False`` keeps the dense SDPA
call (for comparisons). Flex attention is compiled on first use (a few seconds), also when the model is not.
"""

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

__all__ = ["BlockMask", "block_mask", "flex_attend", "flex_attention_supported"]


def flex_attention_supported(device: torch.device) -> bool:
    """Whether flex attention runs well on ``device``: CUDA, compute capability 8.0+ (Ampere and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def block_mask(mask: torch.Tensor) -> BlockMask:
    """The ``BlockMask`` of a dense ``[b, s, s_kv]`` bool mask (True where a query may attend a key).

    Args:
        mask (torch.Tensor): the dense mask, on the device attention runs on.

    Returns:
        BlockMask: the same mask, with the tiles that are fully masked or fully visible marked as such.
    """
    batch_size, seq_len, kv_len = mask.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return mask[b, q_idx, kv_idx]

    return create_block_mask(mask_mod, B=batch_size, H=None, Q_LEN=seq_len, KV_LEN=kv_len, device=mask.device)


@functools.cache
def _compiled_flex_attention():
    # flex attention is a reference implementation until compiled; inside a compiled layer this call is traced
    # into that layer's graph instead
    return torch.compile(flex_attention, dynamic=False)


def flex_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask, *, scale: float, enable_gqa: bool
) -> torch.Tensor:
    """Attention of q [b, num_heads, s, head_dim] over k, v [b, num_kv_heads, s_kv, head_dim] under ``mask``.

    Returns:
        torch.Tensor: [b, num_heads, s, head_dim].
    """
    return _compiled_flex_attention()(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)
