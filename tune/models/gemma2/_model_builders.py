"""Gemma 2 model builders: the released sizes, with literal dimensions from each model's ``config.json``."""

from collections.abc import Sequence

from tune.models.gemma2._component_builders import gemma2, lora_gemma2
from tune.modules import TransformerDecoder


def gemma2_2b() -> TransformerDecoder:
    """Gemma 2 2B (dimensions of https://huggingface.co/google/gemma-2-2b).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return gemma2(
        vocab_size=256000,
        num_layers=26,
        num_heads=8,
        num_kv_heads=4,
        embed_dim=2304,
        intermediate_dim=9216,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=256,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=256,
    )


def lora_gemma2_2b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Gemma 2 2B with LoRA adapters (see :func:`lora_gemma2`).

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
    return lora_gemma2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=256000,
        num_layers=26,
        num_heads=8,
        num_kv_heads=4,
        embed_dim=2304,
        intermediate_dim=9216,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=256,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=256,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_gemma2_2b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Gemma 2 2B with QLoRA: :func:`lora_gemma2_2b` with ``quantize_base=True``."""
    return lora_gemma2_2b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def gemma2_9b() -> TransformerDecoder:
    """Gemma 2 9B (dimensions of https://huggingface.co/google/gemma-2-9b).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return gemma2(
        vocab_size=256000,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        embed_dim=3584,
        intermediate_dim=14336,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=256,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=256,
    )


def lora_gemma2_9b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Gemma 2 9B with LoRA adapters (see :func:`lora_gemma2`).

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
    return lora_gemma2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=256000,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        embed_dim=3584,
        intermediate_dim=14336,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=256,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=256,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_gemma2_9b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Gemma 2 9B with QLoRA: :func:`lora_gemma2_9b` with ``quantize_base=True``."""
    return lora_gemma2_9b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def gemma2_27b() -> TransformerDecoder:
    """Gemma 2 27B (dimensions of https://huggingface.co/google/gemma-2-27b).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return gemma2(
        vocab_size=256000,
        num_layers=46,
        num_heads=32,
        num_kv_heads=16,
        embed_dim=4608,
        intermediate_dim=36864,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=128,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=144,
    )


def lora_gemma2_27b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Gemma 2 27B with LoRA adapters (see :func:`lora_gemma2`).

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
    return lora_gemma2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=256000,
        num_layers=46,
        num_heads=32,
        num_kv_heads=16,
        embed_dim=4608,
        intermediate_dim=36864,
        max_seq_len=8192,
        norm_eps=1e-6,
        rope_base=10_000.0,
        head_dim=128,
        hidden_capping_value=50.0,
        final_capping_value=30.0,
        sliding_window_size=4096,
        query_pre_attn_scalar=144,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_gemma2_27b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Gemma 2 27B with QLoRA: :func:`lora_gemma2_27b` with ``quantize_base=True``."""
    return lora_gemma2_27b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )
