"""Gemma 2 component builders: the architecture as a function of its dimensions."""

from collections.abc import Sequence

from tune.models._common import build_decoder, lora_spec
from tune.modules import TransformerDecoder


def gemma2(
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
    rope_base: float = 10_000.0,
    hidden_capping_value: float | None = 50.0,
    final_capping_value: float | None = 30.0,
    sliding_window_size: int | None = 4096,
    query_pre_attn_scalar: float | None = None,
) -> TransformerDecoder:
    """A Gemma 2 decoder (Gemma Team, 2024, https://arxiv.org/abs/2408.00118).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        head_dim (int): features per head (256 in the released sizes, not embed_dim // num_heads).
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_base (float): RoPE theta. Default 10000.
        hidden_capping_value (float | None): attention-logit soft-cap. Default 50.
        final_capping_value (float | None): output-logit soft-cap. Default 30.
        sliding_window_size (int | None): window of the local layers (0, 2, 4, ...; the others attend
            globally). Default 4096.
        query_pre_attn_scalar (float | None): attention scale is ``query_pre_attn_scalar ** -0.5``. Default
            head_dim.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return build_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        head_dim=head_dim,
        tie_word_embeddings=True,
        gemma_norms=True,
        activation="gelu_tanh",
        embed_scale=embed_dim**0.5,
        attn_scale=(query_pre_attn_scalar or head_dim) ** -0.5,
        attn_softcapping=hidden_capping_value,
        final_softcapping=final_capping_value,
        sliding_windows=[sliding_window_size if i % 2 == 0 else None for i in range(num_layers)],
    )


def lora_gemma2(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    *,
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
    rope_base: float = 10_000.0,
    hidden_capping_value: float | None = 50.0,
    final_capping_value: float | None = 30.0,
    sliding_window_size: int | None = 4096,
    query_pre_attn_scalar: float | None = None,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    apply_lora_to_output: bool = False,
) -> TransformerDecoder:
    """:func:`gemma2` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base, hidden_capping_value, final_capping_value, sliding_window_size,
            query_pre_attn_scalar: as in :func:`gemma2`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.
        apply_lora_to_output (bool): only False is accepted: Gemma 2 ties its output projection to the token
            embeddings (torchtune's builder has no such argument; kept for configs that pass it). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, or LoRA on a tied output.
    """
    return build_decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        head_dim=head_dim,
        tie_word_embeddings=True,
        gemma_norms=True,
        activation="gelu_tanh",
        embed_scale=embed_dim**0.5,
        attn_scale=(query_pre_attn_scalar or head_dim) ** -0.5,
        attn_softcapping=hidden_capping_value,
        final_softcapping=final_capping_value,
        sliding_windows=[sliding_window_size if i % 2 == 0 else None for i in range(num_layers)],
        lora=lora_spec(
            lora_attn_modules,
            apply_lora_to_mlp,
            apply_lora_to_output,
            lora_rank,
            lora_alpha,
            lora_dropout,
            use_dora,
            quantize_base,
        ),
    )
