"""Mistral model builders: the released sizes, with literal dimensions from each model's ``config.json``."""

from collections.abc import Sequence

from tune.models.mistral._component_builders import lora_mistral, mistral
from tune.modules import TransformerDecoder


def mistral_7b() -> TransformerDecoder:
    """Mistral 7B v0.1 (dimensions of https://huggingface.co/mistralai/Mistral-7B-v0.1).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return mistral(
        vocab_size=32000,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        intermediate_dim=14336,
        max_seq_len=32768,
        norm_eps=1e-5,
        rope_base=10_000.0,
        sliding_window=4096,
    )


def lora_mistral_7b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Mistral 7B v0.1 with LoRA adapters (see :func:`lora_mistral`).

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt, from
            ``q_proj, k_proj, v_proj, output_proj``.
        apply_lora_to_mlp (bool): adapt the feed-forward projections too. Default False.
        apply_lora_to_output (bool): adapt the output projection (untied models only). Default False.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        TransformerDecoder: the model with fresh adapters.
    """
    return lora_mistral(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=32000,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        intermediate_dim=14336,
        max_seq_len=32768,
        norm_eps=1e-5,
        rope_base=10_000.0,
        sliding_window=4096,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_mistral_7b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Mistral 7B v0.1 with QLoRA: :func:`lora_mistral_7b` with ``quantize_base=True``."""
    return lora_mistral_7b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )
