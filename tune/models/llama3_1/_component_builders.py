"""Llama 3.1 component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LoRASpec, build_decoder, llama_intermediate_dim, lora_builder
from tune.modules import TransformerDecoder

# torchtune's LoRA builder lists these base arguments in this order after max_seq_len
_LORA_ORDER = ("intermediate_dim", "attn_dropout", "norm_eps", "rope_base")


def llama3_1(
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
    scale_factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    old_context_len: int = 8192,
) -> TransformerDecoder:
    """A Llama 3.1 decoder (Grattafiori et al., 2024, https://arxiv.org/abs/2407.21783).

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
        scale_factor (float): Llama 3.1 RoPE scaling factor (see ``Llama3ScaledRoPE``). Default 8.
        low_freq_factor (float): RoPE scaling low-frequency factor. Default 1.
        high_freq_factor (float): RoPE scaling high-frequency factor. Default 4.
        old_context_len (int): pre-training context the RoPE scaling extends. Default 8192.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama3_1(lora=None, **locals())


@lora_builder(llama3_1, regroup=_LORA_ORDER)
def lora_llama3_1(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`llama3_1` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim, attn_dropout,
            norm_eps, rope_base, scale_factor, low_freq_factor, high_freq_factor, old_context_len: as in
            :func:`llama3_1`.
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
    return _llama3_1(lora=lora, **dims)


def _llama3_1(
    *,
    lora: LoRASpec | None,
    intermediate_dim: int | None,
    scale_factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    old_context_len: int,
    **dims: Any,
) -> TransformerDecoder:
    return build_decoder(
        **dims,
        intermediate_dim=intermediate_dim or llama_intermediate_dim(dims["embed_dim"]),
        rope_scaling=dict(
            scale_factor=scale_factor,
            low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
            old_context_len=old_context_len,
        ),
        lora=lora,
    )
