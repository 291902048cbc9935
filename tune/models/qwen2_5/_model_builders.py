"""Qwen2.5 model builders: the released sizes, with literal dimensions from each model's ``config.json``."""

from collections.abc import Sequence

from tune.models.qwen2_5._component_builders import lora_qwen2, qwen2
from tune.modules import TransformerDecoder


def qwen2_5_0_5b() -> TransformerDecoder:
    """Qwen2.5 0.5B (dimensions of https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=151936,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        embed_dim=896,
        intermediate_dim=4864,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )


def lora_qwen2_5_0_5b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 0.5B with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=151936,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        embed_dim=896,
        intermediate_dim=4864,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_0_5b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 0.5B with QLoRA: :func:`lora_qwen2_5_0_5b` with ``quantize_base=True``."""
    return lora_qwen2_5_0_5b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_1_5b_base() -> TransformerDecoder:
    """Qwen2.5 1.5B base (dimensions of https://huggingface.co/Qwen/Qwen2.5-1.5B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=151936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1536,
        intermediate_dim=8960,
        max_seq_len=131072,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )


def lora_qwen2_5_1_5b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 1.5B base with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=151936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1536,
        intermediate_dim=8960,
        max_seq_len=131072,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_1_5b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 1.5B base with QLoRA: :func:`lora_qwen2_5_1_5b_base` with ``quantize_base=True``."""
    return lora_qwen2_5_1_5b_base(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_1_5b_instruct() -> TransformerDecoder:
    """Qwen2.5 1.5B instruct (dimensions of https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=151936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1536,
        intermediate_dim=8960,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )


def lora_qwen2_5_1_5b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 1.5B instruct with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=151936,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        embed_dim=1536,
        intermediate_dim=8960,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_1_5b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 1.5B instruct with QLoRA: :func:`lora_qwen2_5_1_5b_instruct` with ``quantize_base=True``."""
    return lora_qwen2_5_1_5b_instruct(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_3b() -> TransformerDecoder:
    """Qwen2.5 3B (dimensions of https://huggingface.co/Qwen/Qwen2.5-3B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=151936,
        num_layers=36,
        num_heads=16,
        num_kv_heads=2,
        embed_dim=2048,
        intermediate_dim=11008,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
    )


def lora_qwen2_5_3b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 3B with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=151936,
        num_layers=36,
        num_heads=16,
        num_kv_heads=2,
        embed_dim=2048,
        intermediate_dim=11008,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=True,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_3b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 3B with QLoRA: :func:`lora_qwen2_5_3b` with ``quantize_base=True``."""
    return lora_qwen2_5_3b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_7b_base() -> TransformerDecoder:
    """Qwen2.5 7B base (dimensions of https://huggingface.co/Qwen/Qwen2.5-7B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3584,
        intermediate_dim=18944,
        max_seq_len=131072,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_7b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 7B base with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3584,
        intermediate_dim=18944,
        max_seq_len=131072,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_7b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 7B base with QLoRA: :func:`lora_qwen2_5_7b_base` with ``quantize_base=True``."""
    return lora_qwen2_5_7b_base(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_7b_instruct() -> TransformerDecoder:
    """Qwen2.5 7B instruct (dimensions of https://huggingface.co/Qwen/Qwen2.5-7B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3584,
        intermediate_dim=18944,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_7b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 7B instruct with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        embed_dim=3584,
        intermediate_dim=18944,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_7b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 7B instruct with QLoRA: :func:`lora_qwen2_5_7b_instruct` with ``quantize_base=True``."""
    return lora_qwen2_5_7b_instruct(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_14b_base() -> TransformerDecoder:
    """Qwen2.5 14B base (dimensions of https://huggingface.co/Qwen/Qwen2.5-14B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=13824,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_14b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 14B base with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=13824,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_14b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 14B base with QLoRA: :func:`lora_qwen2_5_14b_base` with ``quantize_base=True``."""
    return lora_qwen2_5_14b_base(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_14b_instruct() -> TransformerDecoder:
    """Qwen2.5 14B instruct (dimensions of https://huggingface.co/Qwen/Qwen2.5-14B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=13824,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_14b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 14B instruct with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=13824,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_14b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 14B instruct with QLoRA: :func:`lora_qwen2_5_14b_instruct` with ``quantize_base=True``."""
    return lora_qwen2_5_14b_instruct(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_32b_base() -> TransformerDecoder:
    """Qwen2.5 32B base (dimensions of https://huggingface.co/Qwen/Qwen2.5-32B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=27648,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_32b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 32B base with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=27648,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_32b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 32B base with QLoRA: :func:`lora_qwen2_5_32b_base` with ``quantize_base=True``."""
    return lora_qwen2_5_32b_base(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_32b_instruct() -> TransformerDecoder:
    """Qwen2.5 32B instruct (dimensions of https://huggingface.co/Qwen/Qwen2.5-32B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=27648,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_32b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 32B instruct with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=64,
        num_heads=40,
        num_kv_heads=8,
        embed_dim=5120,
        intermediate_dim=27648,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_32b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 32B instruct with QLoRA: :func:`lora_qwen2_5_32b_instruct` with ``quantize_base=True``."""
    return lora_qwen2_5_32b_instruct(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_72b_base() -> TransformerDecoder:
    """Qwen2.5 72B base (dimensions of https://huggingface.co/Qwen/Qwen2.5-72B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=29568,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_72b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 72B base with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=29568,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_72b_base(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 72B base with QLoRA: :func:`lora_qwen2_5_72b_base` with ``quantize_base=True``."""
    return lora_qwen2_5_72b_base(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def qwen2_5_72b_instruct() -> TransformerDecoder:
    """Qwen2.5 72B instruct (dimensions of https://huggingface.co/Qwen/Qwen2.5-72B-Instruct).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return qwen2(
        vocab_size=152064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=29568,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
    )


def lora_qwen2_5_72b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 72B instruct with LoRA adapters (see :func:`lora_qwen2`).

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
    return lora_qwen2(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=152064,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=29568,
        max_seq_len=32768,
        norm_eps=1e-6,
        rope_base=1_000_000.0,
        tie_word_embeddings=False,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_qwen2_5_72b_instruct(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Qwen2.5 72B instruct with QLoRA: :func:`lora_qwen2_5_72b_instruct` with ``quantize_base=True``."""
    return lora_qwen2_5_72b_instruct(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )
