"""Llama 2 component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LoRASpec, build_decoder, llama_intermediate_dim, lora_builder
from tune.modules import TransformerDecoder

# torchtune's LoRA builders list these base arguments in this order after max_seq_len
_LORA_ORDER = ("intermediate_dim", "attn_dropout", "norm_eps", "rope_base")


def llama2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
) -> TransformerDecoder:
    """A Llama 2 decoder (Touvron et al., 2023, https://arxiv.org/abs/2307.09288): RMSNorm, SwiGLU, RoPE, GQA.

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads (== num_heads for MHA; fewer for GQA as in 70B).
        embed_dim (int): model width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        intermediate_dim (int | None): feed-forward hidden width; None: ``llama_intermediate_dim(embed_dim)``.
            Default None.
        norm_eps (float): RMSNorm epsilon. Default 1e-5.
        rope_base (float): RoPE theta. Default 10000.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama2(lora=None, **locals())


@lora_builder(llama2, regroup=_LORA_ORDER)
def lora_llama2(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`llama2` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection. Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim, attn_dropout,
            norm_eps, rope_base: as in :func:`llama2`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``.
    """
    return _llama2(lora=lora, **dims)


def llama2_classifier(
    num_classes: int,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    intermediate_dim: int | None = None,
    norm_eps: float = 1e-5,
) -> TransformerDecoder:
    """:func:`llama2` whose output projection scores ``num_classes`` classes instead of the vocabulary.

    The model returns ``[b, s, num_classes]``: a score at every position, as the ``score`` head of transformers'
    ``LlamaForSequenceClassification`` computes before picking the last non-padding position. A reward model is
    this with ``num_classes=1``.

    Args:
        num_classes (int): outputs per position.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, attn_dropout, intermediate_dim,
            norm_eps: as in :func:`llama2` (RoPE theta is Llama 2's 10000).

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama2(lora=None, **locals())


@lora_builder(llama2_classifier, regroup=_LORA_ORDER[:3], required=("lora_rank", "lora_alpha"))
def lora_llama2_classifier(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`llama2_classifier` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules, apply_lora_to_mlp, lora_dropout, use_dora, quantize_base: as in :func:`lora_llama2`.
        apply_lora_to_output (bool): adapt the classification head. Default False.
        num_classes, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim,
            attn_dropout, norm_eps: as in :func:`llama2_classifier`.
        lora_rank (int): adapter rank.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank).

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``.
    """
    return _llama2(lora=lora, **dims)


def _llama2(
    *, lora: LoRASpec | None, intermediate_dim: int | None, num_classes: int | None = None, **dims: Any
) -> TransformerDecoder:
    # the layers of every builder above; a classifier's head has num_classes outputs
    width = intermediate_dim or llama_intermediate_dim(dims["embed_dim"])
    return build_decoder(**dims, intermediate_dim=width, output_dim=num_classes, lora=lora)
