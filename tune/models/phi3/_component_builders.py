"""Phi-3 component builders: the architecture as a function of its dimensions."""

from collections.abc import Mapping
from typing import Any

from tune.models._common import LoRASpec, build_decoder, lora_builder
from tune.modules import LongRoPE, TransformerDecoder


def _use_long_rope(
    model: TransformerDecoder, rope_scaling: Mapping[str, Any] | None, rope_base: float
) -> TransformerDecoder:
    """Gives every layer one shared :class:`~tune.modules.LongRoPE` built from ``rope_scaling`` (none: as built)."""
    if rope_scaling is None:
        return model
    known = {"short_factor", "long_factor", "original_max_seq_len", "scale_factor", "attention_factor"}
    unknown = sorted(set(rope_scaling) - known)
    if unknown or "original_max_seq_len" not in rope_scaling:
        raise ValueError(
            f"rope_scaling takes LongRoPE's arguments {sorted(known)} (original_max_seq_len required); got "
            f"{sorted(rope_scaling)}."
        )
    attn = model.layers[0].attn
    num_pairs = attn.head_dim // 2
    kwargs = dict(rope_scaling)
    for name in ("short_factor", "long_factor"):
        kwargs[name] = kwargs.get(name) or [1.0] * num_pairs  # no rescaling unless given
    rope = LongRoPE(attn.head_dim, max_seq_len=model.max_seq_len, base=rope_base, **kwargs)
    for layer in model.layers:
        layer.attn.pos_embeddings = rope
    return model


def phi3(
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
    rope_scaling: Mapping[str, Any] | None = None,
) -> TransformerDecoder:
    """A Phi-3 decoder (Abdin et al., 2024, https://arxiv.org/abs/2404.14219).

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
        sliding_window (int | None): every layer attends at most this many tokens back (2047 in Phi-3-mini-4k);
            None for full attention. Default None.
        rope_scaling (Mapping[str, Any] | None): LongRoPE (the 128k-context Phi-3 models) instead of plain RoPE:
            keyword arguments of :class:`~tune.modules.LongRoPE` besides dim/max_seq_len/base, i.e.
            ``original_max_seq_len`` (required), ``short_factor`` and ``long_factor`` (``head_dim // 2`` values
            each; default 1.0 each, no rescaling), ``scale_factor``, ``attention_factor``. Default None.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for unknown ``rope_scaling`` keys or factor lists of the wrong length.
    """
    return _phi3(lora=None, **locals())


@lora_builder(phi3)
def lora_phi3(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`phi3` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout,
            norm_eps, rope_base, sliding_window, rope_scaling: as in :func:`phi3`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        TransformerDecoder: the model; only adapter parameters are meant to be trained.

    Raises:
        ValueError: for an unknown module in ``lora_attn_modules``, LoRA on a tied output, or a bad
            ``rope_scaling``.
    """
    return _phi3(lora=lora, **dims)


def _phi3(
    *, lora: LoRASpec | None, sliding_window: int | None, rope_scaling: Mapping[str, Any] | None, **dims: Any
) -> TransformerDecoder:
    windows = [sliding_window] * dims["num_layers"]
    model = build_decoder(**dims, sliding_windows=windows, lora=lora)
    return _use_long_rope(model, rope_scaling, dims["rope_base"])
