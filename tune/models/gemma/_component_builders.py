"""Gemma component builders: the architecture as a function of its dimensions."""

from typing import Any

from torch import nn

from tune.models._common import LORA_HEAD, LORA_TAIL, LoRASpec, build_decoder, lora_builder
from tune.modules import TransformerDecoder


def _gemma_decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float,
    norm_eps: float,
    rope_base: float,
    lora: LoRASpec | None,
) -> TransformerDecoder:
    model = build_decoder(
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
        lora=lora,
    )
    # `gemma_norms` gives every norm Gemma's (1 + weight) scale and adds the post-attention and post-feed-forward
    # norms Gemma 2 introduced; Gemma 1 has only the two pre-norms of each layer (its Hugging Face
    # post_attention_layernorm is the pre-feed-forward norm, as in Llama), so the extra two go
    for layer in model.layers:
        layer.sa_scale = nn.Identity()
        layer.mlp_scale = nn.Identity()
    return model


def gemma(
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
) -> TransformerDecoder:
    """A Gemma decoder (Gemma Team, 2024, https://arxiv.org/abs/2403.08295).

    Pre-norm layers with RMSNorm scaling by ``1 + weight``, tanh-approximated GELU in a gated feed-forward, token
    embeddings multiplied by ``sqrt(embed_dim)`` and tied to the output projection; every layer attends
    globally, with no soft-capping.

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        head_dim (int): features per head (256 in the released sizes, not embed_dim // num_heads at 7B).
        num_kv_heads (int): key/value heads (1 at 2B: multi-query attention).
        embed_dim (int): model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon. Default 1e-6.
        rope_base (float): RoPE theta. Default 10000.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _gemma_decoder(lora=None, **locals())


@lora_builder(gemma, head=LORA_HEAD[:2], tail=(*LORA_TAIL, "apply_lora_to_output"))
def lora_gemma(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`gemma` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base: as in :func:`gemma`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.
        apply_lora_to_output (bool): only False is accepted: Gemma ties its output projection to the token
            embeddings (torchtune's builder has no such argument; kept for configs that pass it). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, or LoRA on the tied output.
    """
    return _gemma_decoder(lora=lora, **dims)
