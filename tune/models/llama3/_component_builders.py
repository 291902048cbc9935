"""Llama 3 component builders: the architecture as a function of its dimensions."""

from typing import Any

from tune.models._common import LoRASpec, build_decoder, llama_intermediate_dim, lora_builder
from tune.modules import TransformerDecoder

# torchtune's LoRA builder lists these base arguments in this order after max_seq_len
_LORA_ORDER = ("intermediate_dim", "attn_dropout", "norm_eps", "rope_base")


def llama3(
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
) -> TransformerDecoder:
    """A Llama 3 decoder (Grattafiori et al., 2024, https://arxiv.org/abs/2407.21783).

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

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    return _llama3(lora=None, **locals())


@lora_builder(llama3, regroup=_LORA_ORDER)
def lora_llama3(lora: LoRASpec, **dims: Any) -> TransformerDecoder:
    """:func:`llama3` with LoRA (or DoRA, or QLoRA) layers in place of the chosen linear layers.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim, attn_dropout,
            norm_eps, rope_base: as in :func:`llama3`.
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
    return _llama3(lora=lora, **dims)


def _llama3(*, lora: LoRASpec | None, intermediate_dim: int | None, **dims: Any) -> TransformerDecoder:
    width = intermediate_dim or llama_intermediate_dim(dims["embed_dim"])
    return build_decoder(**dims, intermediate_dim=width, lora=lora)
