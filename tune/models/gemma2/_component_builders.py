"""Gemma 2 component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LORA_HEAD, LORA_TAIL, LoRASpec, build_decoder, lora_builder
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
    return _gemma2(lora=None, **locals())


@lora_builder(gemma2, head=LORA_HEAD[:2], tail=(*LORA_TAIL, "apply_lora_to_output"))
def lora_gemma2(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
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
    return _gemma2(lora=lora, **dims)


def _gemma2(
    *,
    lora: LoRASpec | None,
    hidden_capping_value: float | None,
    final_capping_value: float | None,
    sliding_window_size: int | None,
    query_pre_attn_scalar: float | None,
    **dims: Any,
) -> TransformerDecoder:
    return build_decoder(
        **dims,
        tie_word_embeddings=True,
        gemma_norms=True,
        activation="gelu_tanh",
        embed_scale=dims["embed_dim"] ** 0.5,
        attn_scale=(query_pre_attn_scalar or dims["head_dim"]) ** -0.5,
        attn_softcapping=hidden_capping_value,
        final_softcapping=final_capping_value,
        # the even layers (0, 2, ...) are local, the odd ones global
        sliding_windows=[sliding_window_size if i % 2 == 0 else None for i in range(dims["num_layers"])],
        lora=lora,
    )
