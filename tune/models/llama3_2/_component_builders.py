"""Llama 3.2 (text) component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LoRASpec, build_decoder, llama_intermediate_dim, lora_builder
from tune.modules import TransformerDecoder

# torchtune's LoRA builder lists these base arguments in this order after max_seq_len
_LORA_ORDER = ("intermediate_dim", "attn_dropout", "norm_eps", "rope_base")


def llama3_2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 32.0,
    tie_word_embeddings: bool = True,
) -> TransformerDecoder:
    """A Llama 3.2 (text) decoder (https://ai.meta.com/blog/llama-3-2-connect-2024-vision-edge-mobile-devices/).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        rope_base (float): RoPE theta. Default 500000.
        intermediate_dim (int | None): feed-forward hidden width; None: ``llama_intermediate_dim(embed_dim)``.
            Default None.
        norm_eps (float): RMSNorm epsilon. Default 1e-5.
        scale_factor (float): Llama 3.1-style RoPE scaling factor (32 for Llama 3.2). Default 32.
        tie_word_embeddings (bool): the output projection reuses the token embeddings. Default True.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama3_2(lora=None, **locals())


def llama3_2_classifier(
    num_classes: int,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    rope_base: float = 500_000.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    scale_factor: float = 32.0,
) -> TransformerDecoder:
    """:func:`llama3_2` whose output projection (never tied to the embeddings) scores ``num_classes`` classes.

    The model returns ``[b, s, num_classes]``: a score at every position, as the ``score`` head of transformers'
    ``LlamaForSequenceClassification`` computes before picking the last non-padding position. A reward model is
    this with ``num_classes=1``.

    Args:
        num_classes (int): outputs per position.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, attn_dropout, rope_base,
            intermediate_dim, norm_eps, scale_factor: as in :func:`llama3_2`.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama3_2(lora=None, **locals())


@lora_builder(llama3_2, regroup=_LORA_ORDER)
def lora_llama3_2(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`llama3_2` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim, attn_dropout,
            norm_eps, rope_base, scale_factor, tie_word_embeddings: as in :func:`llama3_2`.
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
    return _llama3_2(lora=lora, **dims)


def _llama3_2(
    *,
    lora: LoRASpec | None,
    intermediate_dim: int | None,
    scale_factor: float,
    num_classes: int | None = None,
    **dims: Any,
) -> TransformerDecoder:
    # the layers of every builder above; a classifier's head has num_classes outputs
    return build_decoder(
        **dims,
        intermediate_dim=intermediate_dim or llama_intermediate_dim(dims["embed_dim"]),
        rope_scaling=dict(scale_factor=scale_factor),
        output_dim=num_classes,
        lora=lora,
    )
