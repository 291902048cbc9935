"""Llama 3.1 model builders: the released sizes, with literal dimensions from each model's ``config.json``."""

from collections.abc import Sequence

from tune.models.llama3_1._component_builders import llama3_1, lora_llama3_1
from tune.modules import TransformerDecoder


def llama3_1_8b() -> TransformerDecoder:
    """Llama 3.1 8B (dimensions of https://huggingface.co/meta-llama/Llama-3.1-8B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return llama3_1(
        vocab_size=128256,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        intermediate_dim=14336,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
    )


def lora_llama3_1_8b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 8B with LoRA adapters (see :func:`lora_llama3_1`).

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
    return lora_llama3_1(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=128256,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        embed_dim=4096,
        intermediate_dim=14336,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_llama3_1_8b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 8B with QLoRA: :func:`lora_llama3_1_8b` with ``quantize_base=True``."""
    return lora_llama3_1_8b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def llama3_1_70b() -> TransformerDecoder:
    """Llama 3.1 70B (dimensions of https://huggingface.co/meta-llama/Llama-3.1-70B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return llama3_1(
        vocab_size=128256,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=28672,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
    )


def lora_llama3_1_70b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 70B with LoRA adapters (see :func:`lora_llama3_1`).

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
    return lora_llama3_1(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=128256,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        embed_dim=8192,
        intermediate_dim=28672,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_llama3_1_70b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 70B with QLoRA: :func:`lora_llama3_1_70b` with ``quantize_base=True``."""
    return lora_llama3_1_70b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )


def llama3_1_405b() -> TransformerDecoder:
    """Llama 3.1 405B (dimensions of https://huggingface.co/meta-llama/Llama-3.1-405B).

    Returns:
        TransformerDecoder: the model, randomly initialised; load weights with ``tune.models.from_hf`` or a
        checkpointer.
    """
    return llama3_1(
        vocab_size=128256,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        embed_dim=16384,
        intermediate_dim=53248,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
    )


def lora_llama3_1_405b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 405B with LoRA adapters (see :func:`lora_llama3_1`).

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
    return lora_llama3_1(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        vocab_size=128256,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        embed_dim=16384,
        intermediate_dim=53248,
        max_seq_len=131072,
        norm_eps=1e-5,
        rope_base=500_000.0,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )


def qlora_llama3_1_405b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Llama 3.1 405B with QLoRA: :func:`lora_llama3_1_405b` with ``quantize_base=True``."""
    return lora_llama3_1_405b(
        lora_attn_modules,
        apply_lora_to_mlp,
        apply_lora_to_output,
        lora_rank,
        lora_alpha,
        lora_dropout,
        use_dora,
        quantize_base=True,
    )
