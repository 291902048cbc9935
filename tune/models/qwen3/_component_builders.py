"""Qwen3 component builders: the architecture as a function of its dimensions."""

from collections.abc import Sequence
from typing import Any

from tune.models._common import LoRASpec, build_decoder, lora_builder
from tune.modules import TransformerDecoder


def qwen3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    intermediate_dim: int,
    attn_dropout: float = 0.0,
    head_dim: int | None = None,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    q_proj_bias: bool = False,
    k_proj_bias: bool = False,
    v_proj_bias: bool = False,
    q_norm: bool = True,
    k_norm: bool = True,
    sliding_windows: Sequence[int | None] | None = None,
) -> TransformerDecoder:
    """A Qwen3 decoder (Qwen Team, 2025, https://arxiv.org/abs/2505.09388).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        intermediate_dim (int): feed-forward hidden width.
        attn_dropout (float): attention dropout. Default 0.0.
        head_dim (int | None): features per head; Qwen3 uses 128 at every size. Default embed_dim // num_heads.
        norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_base (float): RoPE theta. Default 1e6.
        tie_word_embeddings (bool): the output projection reuses the token embeddings (0.6B-4B). Default False.
        q_proj_bias (bool): bias in the query projection. Default False.
        k_proj_bias (bool): bias in the key projection. Default False.
        v_proj_bias (bool): bias in the value projection. Default False.
        q_norm (bool): per-head RMSNorm of queries before RoPE. Default True.
        k_norm (bool): per-head RMSNorm of keys before RoPE (must equal q_norm). Default True.
        sliding_windows (Sequence[int | None] | None): per-layer sliding window. Default None: full attention.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _qwen3(lora=None, **locals())


@lora_builder(qwen3)
def lora_qwen3(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`qwen3` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim, attn_dropout,
            head_dim, norm_eps, rope_base, tie_word_embeddings, q_proj_bias, k_proj_bias, v_proj_bias, q_norm,
            k_norm, sliding_windows: as in :func:`qwen3`.
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
    return _qwen3(lora=lora, **dims)


def _qwen3(*, lora: LoRASpec | None, q_norm: bool, k_norm: bool, **dims: Any) -> TransformerDecoder:
    if q_norm != k_norm:
        raise ValueError(f"q_norm and k_norm must be equal (Qwen3 normalises both), got {q_norm} and {k_norm}.")
    return build_decoder(**dims, qk_norm=q_norm, lora=lora)
