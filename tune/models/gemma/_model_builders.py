"""Gemma model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`gemma`) and the Hugging Face repo whose
``config.json`` they are (the pretrained release, which torchtune's configs fine-tune; the ``-it`` releases have the
same dimensions); the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters (made by
``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
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


lora_gemma_2b = lora_size_builder(gemma_2b, lora_gemma, MODEL_SIZES)
qlora_gemma_2b = qlora_builder(lora_gemma_2b)


def gemma_7b() -> TransformerDecoder:
    """Gemma 7B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma(**MODEL_SIZES["gemma_7b"].dims)


lora_gemma_7b = lora_size_builder(gemma_7b, lora_gemma, MODEL_SIZES)
qlora_gemma_7b = qlora_builder(lora_gemma_7b)
