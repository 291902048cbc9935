"""Phi-3 model builders: the released sizes, with literal dimensions from each model's ``config.json``."""

from collections.abc import Sequence

from tune.models.phi3._component_builders import lora_phi3, phi3
from tune.modules import TransformerDecoder


def phi3_mini() -> TransformerDecoder:
    """Phi-3-mini-4k (dimensions of https://huggingface.co/microsoft/Phi-3-mini-4k-instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return phi3(
        vocab_size=32064,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        embed_dim=3072,
        intermediate_dim=8192,
        max_seq_len=4096,
        norm_eps=1e-5,
        rope_base=10_000.0,
        sliding_window=2047,
    )


def lora_phi3_mini(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Phi-3-mini-4k with LoRA adapters (see :func:`lora_phi3`).

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
    return lora_phi3(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=32064,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        embed_dim=3072,
        intermediate_dim=8192,
        max_seq_len=4096,
        norm_eps=1e-5,
        rope_base=10_000.0,
        sliding_window=2047,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_phi3_mini(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Phi-3-mini-4k with QLoRA: :func:`lora_phi3_mini` with ``quantize_base=True``."""
    return lora_phi3_mini(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )
