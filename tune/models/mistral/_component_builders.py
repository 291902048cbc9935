"""Mistral component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LORA_TAIL, LoRASpec, build_decoder, lora_builder
from tune.modules import TransformerDecoder


def mistral(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    sliding_window: int | None = None,
    head_dim: int | None = None,
) -> TransformerDecoder:
    """A Mistral decoder (Jiang et al., 2023, https://arxiv.org/abs/2310.06825).

    Args:
        vocab_size (int): tokens in the vocabulary.
        num_layers (int): transformer layers.
        num_heads (int): query heads.
        num_kv_heads (int): key/value heads (fewer than num_heads for grouped-query attention).
        embed_dim (int): model width.
        intermediate_dim (int): feed-forward hidden width.
        max_seq_len (int): longest sequence (RoPE table size, KV-cache default).
        attn_dropout (float): attention dropout. Default 0.0.
        norm_eps (float): RMSNorm epsilon. Default 1e-5.
        rope_base (float): RoPE theta. Default 10000.
        sliding_window (int | None): every layer attends at most this many tokens back (4096 in Mistral 7B
            v0.1); None for full attention. Default None.
        head_dim (int | None): features per head; None: embed_dim // num_heads (Mistral 7B). Mistral NeMo sets
            128 where that gives 160. Default None.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _mistral(lora=None, **locals())


@lora_builder(mistral)
def lora_mistral(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`mistral` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout,
            norm_eps, rope_base, sliding_window, head_dim: as in :func:`mistral`.
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
    return _mistral(lora=lora, **dims)


def mistral_classifier(
    num_classes: int,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    sliding_window: int | None = None,
) -> TransformerDecoder:
    """:func:`mistral` whose output projection scores ``num_classes`` classes instead of the vocabulary.

    The model returns ``[b, s, num_classes]``: a score at every position, as the ``score`` head of transformers'
    ``MistralForSequenceClassification`` computes before picking the last non-padding position. A reward model is
    this with ``num_classes=1``.

    Args:
        num_classes (int): outputs per position.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout,
            norm_eps, rope_base, sliding_window: as in :func:`mistral`.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _mistral(lora=None, **locals())


@lora_builder(mistral_classifier, tail=(*LORA_TAIL, "sliding_window"), required=("lora_rank", "lora_alpha"))
def lora_mistral_classifier(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`mistral_classifier` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules, apply_lora_to_mlp, lora_dropout, use_dora, quantize_base: as in :func:`lora_mistral`.
        apply_lora_to_output (bool): adapt the classification head. Default False.
        num_classes, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base, sliding_window: as in :func:`mistral_classifier`.
        lora_rank (int): adapter rank.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank).

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``.
    """
    return _mistral(lora=lora, **dims)


def _mistral(
    *, lora: LoRASpec | None, sliding_window: int | None, num_classes: int | None = None, **dims: Any
) -> TransformerDecoder:
    # the layers of every builder above; a classifier's head has num_classes outputs
    windows = [sliding_window] * dims["num_layers"]
    return build_decoder(**dims, sliding_windows=windows, output_dim=num_classes, lora=lora)
