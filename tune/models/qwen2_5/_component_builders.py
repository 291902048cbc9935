"""Qwen2 / Qwen2.5 component builders: the architecture as a function of its dimensions."""

from collections.abc import Sequence
from typing import Any

from tune.models._common import LoRASpec, build_decoder, lora_builder
from tune.modules import TransformerDecoder


def qwen2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    sliding_windows: Sequence[int | None] | None = None,
) -> TransformerDecoder:
    """A Qwen2 / Qwen2.5 decoder (Qwen Team, 2024, https://arxiv.org/abs/2412.15115).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon (torchtune's default; the released sizes use 1e-6). Default 1e-5.
        rope_base (float): RoPE theta. Default 1e6.
        tie_word_embeddings (bool): the output projection reuses the token embeddings (0.5B-3B). Default False.
        sliding_windows (Sequence[int | None] | None): per-layer sliding window (``use_sliding_window`` in
            Hugging Face configs; off in every released Qwen2.5). Default None: full attention.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _qwen2(lora=None, **locals())


@lora_builder(qwen2)
def lora_qwen2(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`qwen2` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout,
            norm_eps, rope_base, tie_word_embeddings, sliding_windows: as in :func:`qwen2`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, or LoRA on a tied output.
    """
    return _qwen2(lora=lora, **dims)


def _qwen2(*, lora: LoRASpec | None, **dims: Any) -> TransformerDecoder:
    # Qwen2 has biases on the query, key and value projections
    return build_decoder(**dims, q_proj_bias=True, k_proj_bias=True, v_proj_bias=True, lora=lora)
