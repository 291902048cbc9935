"""Gemma 3 component builders: the architecture as a function of its dimensions.

Gemma 3 (Gemma Team, 2025, https://arxiv.org/abs/2503.19786) keeps Gemma 2's four norms per layer, tanh-GELU
gated feed-forward, embeddings scaled by ``sqrt(embed_dim)`` and tied output, and changes three things: local
(sliding-window) and global layers come five to one (every ``sliding_window_pattern``-th layer is global), each
kind has its own RoPE (theta 10k on local layers; 1M, linearly scaled on the larger sizes, on global layers), and
queries and keys are RMS-normalised per head (replacing Gemma 2's soft-capping, which is gone).
"""

from collections.abc import Sequence
from typing import Any

from tune.models._common import LORA_HEAD, LORA_TAIL, LoRASpec, build_decoder, lora_builder
from tune.modules import LinearScaledRoPE, RotaryPositionalEmbeddings, TransformerDecoder


def _sliding_windows(num_layers: int, sliding_window_size: int | None, pattern: int) -> list[int | None]:
    """The window of each layer: every ``pattern``-th layer (the 6th, 12th, ...) is global (None), the others local.

    Raises:
        ValueError: if ``pattern`` is below 1.
    """
    if pattern < 1:
        raise ValueError(f"sliding_window_pattern must be at least 1 (1: every layer global), got {pattern}.")
    return [None if (i + 1) % pattern == 0 else sliding_window_size for i in range(num_layers)]


def _build_gemma3(
    *,
    vocab_size: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    sliding_windows: Sequence[int | None],
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    rope_local_base: float = 10_000.0,
    rope_scale_factor: float | None = None,
    query_pre_attn_scalar: float | None = None,
    attn_softcapping: float | None = None,
    final_softcapping: float | None = None,
    lora: LoRASpec | None = None,
) -> TransformerDecoder:
    """A Gemma 3 decoder with one window per layer (None: global); shared by the builders and ``from_hf_config``.

    The released models have no soft-capping; a ``config.json`` that sets it gets it (``from_hf_config``). The
    shared decoder assembly gives every layer the local RoPE; the global layers then get the global one (one
    module shared by all global layers, so its tables are stored once).
    """
    model = build_decoder(
        vocab_size=vocab_size,
        num_layers=len(sliding_windows),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_local_base,
        head_dim=head_dim,
        tie_word_embeddings=True,
        qk_norm=True,
        gemma_norms=True,
        activation="gelu_tanh",
        embed_scale=embed_dim**0.5,
        attn_scale=(query_pre_attn_scalar or head_dim) ** -0.5,
        attn_softcapping=attn_softcapping,
        final_softcapping=final_softcapping,
        sliding_windows=sliding_windows,
        lora=lora,
    )
    if rope_scale_factor is None:
        global_rope = RotaryPositionalEmbeddings(head_dim, max_seq_len=max_seq_len, base=rope_base)
    else:
        global_rope = LinearScaledRoPE(
            head_dim, max_seq_len=max_seq_len, base=rope_base, scale_factor=rope_scale_factor
        )
    for layer, window in zip(model.layers, sliding_windows, strict=True):
        if window is None:
            layer.attn.pos_embeddings = global_rope
    return model


def gemma3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    rope_local_base: float = 10_000.0,
    rope_scale_factor: float | None = None,
    sliding_window_size: int | None = 1024,
    sliding_window_pattern: int = 6,
    query_pre_attn_scalar: float | None = None,
) -> TransformerDecoder:
    """A Gemma 3 text decoder (Gemma Team, 2025, https://arxiv.org/abs/2503.19786).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        head_dim (int): features per head (256 in most released sizes, not embed_dim // num_heads).
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_base (float): RoPE theta of the global layers. Default 1e6.
        rope_local_base (float): RoPE theta of the local (sliding-window) layers. Default 1e4.
        rope_scale_factor (float | None): linear RoPE scaling of the global layers (8 in the 4B, 12B and 27B
            sizes); None for none. Default None.
        sliding_window_size (int | None): window of the local layers. Default 1024.
        sliding_window_pattern (int): every this-many-th layer (the 6th, 12th, ...) attends globally. Default 6.
        query_pre_attn_scalar (float | None): attention scale is ``query_pre_attn_scalar ** -0.5``. Default
            head_dim.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for inconsistent sizes or a ``sliding_window_pattern`` below 1.
    """
    return _gemma3(lora=None, **locals())


@lora_builder(gemma3, head=LORA_HEAD[:2], tail=(*LORA_TAIL, "apply_lora_to_output"))
def lora_gemma3(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`gemma3` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base, rope_local_base, rope_scale_factor, sliding_window_size,
            sliding_window_pattern, query_pre_attn_scalar: as in :func:`gemma3`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.
        apply_lora_to_output (bool): only False is accepted: Gemma 3 ties its output projection to the token
            embeddings. Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, or LoRA on the tied output.
    """
    return _gemma3(lora=lora, **dims)


def _gemma3(
    *, num_layers: int, sliding_window_size: int | None, sliding_window_pattern: int, **dims: Any
) -> TransformerDecoder:
    windows = _sliding_windows(num_layers, sliding_window_size, sliding_window_pattern)
    return _build_gemma3(**dims, sliding_windows=windows)
