"""Gemma model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`gemma`) and the Hugging Face repo whose
``config.json`` they are (the pretrained release, which torchtune's configs fine-tune; the ``-it`` releases have
the same dimensions); the builders read it. A ``lora_*`` builder passes its own arguments on with ``**locals()``
(its first statement, so nothing but its parameters is there); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from collections.abc import Sequence

from tune.models._common import ModelSize, qlora_builder
from tune.models.gemma._component_builders import gemma, lora_gemma
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "gemma_2b": ModelSize("google/gemma-2b", dict(
        vocab_size=256000, num_layers=18, num_heads=8, num_kv_heads=1, embed_dim=2048, intermediate_dim=16384,
        max_seq_len=8192, norm_eps=1e-6, rope_base=10_000.0, head_dim=256)),
    "gemma_7b": ModelSize("google/gemma-7b", dict(
        vocab_size=256000, num_layers=28, num_heads=16, num_kv_heads=16, embed_dim=3072, intermediate_dim=24576,
        max_seq_len=8192, norm_eps=1e-6, rope_base=10_000.0, head_dim=256)),
}
# fmt: on


def gemma_2b() -> TransformerDecoder:
    """Gemma 2B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma(**MODEL_SIZES["gemma_2b"].dims)


def lora_gemma_2b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    apply_lora_to_output: bool = False,
) -> TransformerDecoder:
    """Gemma 2B with fresh LoRA adapters (:func:`lora_gemma` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, lora_rank, lora_alpha, lora_dropout, use_dora, quantize_base,
            apply_lora_to_output: as in :func:`lora_gemma`.
    """
    return lora_gemma(**locals(), **MODEL_SIZES["gemma_2b"].dims)


qlora_gemma_2b = qlora_builder(lora_gemma_2b)


def gemma_7b() -> TransformerDecoder:
    """Gemma 7B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma(**MODEL_SIZES["gemma_7b"].dims)


def lora_gemma_7b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
    apply_lora_to_output: bool = False,
) -> TransformerDecoder:
    """Gemma 7B with fresh LoRA adapters (:func:`lora_gemma` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, lora_rank, lora_alpha, lora_dropout, use_dora, quantize_base,
            apply_lora_to_output: as in :func:`lora_gemma`.
    """
    return lora_gemma(**locals(), **MODEL_SIZES["gemma_7b"].dims)


qlora_gemma_7b = qlora_builder(lora_gemma_7b)
