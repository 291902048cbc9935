"""Gemma 2 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`gemma2`) and the Hugging Face repo whose
``config.json`` they are (the instruct release; the pretrained one has the same dimensions); the builders read it. A
``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the family's LoRA
component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.gemma2._component_builders import gemma2, lora_gemma2
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "gemma2_2b": ModelSize("google/gemma-2-2b-it", dict(
        vocab_size=256000, num_layers=26, num_heads=8, num_kv_heads=4, embed_dim=2304, intermediate_dim=9216,
        max_seq_len=8192, norm_eps=1e-6, rope_base=10_000.0, head_dim=256, hidden_capping_value=50.0,
        final_capping_value=30.0, sliding_window_size=4096, query_pre_attn_scalar=256)),
    "gemma2_9b": ModelSize("google/gemma-2-9b-it", dict(
        vocab_size=256000, num_layers=42, num_heads=16, num_kv_heads=8, embed_dim=3584, intermediate_dim=14336,
        max_seq_len=8192, norm_eps=1e-6, rope_base=10_000.0, head_dim=256, hidden_capping_value=50.0,
        final_capping_value=30.0, sliding_window_size=4096, query_pre_attn_scalar=256)),
    "gemma2_27b": ModelSize("google/gemma-2-27b-it", dict(
        vocab_size=256000, num_layers=46, num_heads=32, num_kv_heads=16, embed_dim=4608, intermediate_dim=36864,
        max_seq_len=8192, norm_eps=1e-6, rope_base=10_000.0, head_dim=128, hidden_capping_value=50.0,
        final_capping_value=30.0, sliding_window_size=4096, query_pre_attn_scalar=144)),
}
# fmt: on


def gemma2_2b() -> TransformerDecoder:
    """Gemma 2 2B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma2(**MODEL_SIZES["gemma2_2b"].dims)


lora_gemma2_2b = lora_size_builder(gemma2_2b, lora_gemma2, MODEL_SIZES)
qlora_gemma2_2b = qlora_builder(lora_gemma2_2b)


def gemma2_9b() -> TransformerDecoder:
    """Gemma 2 9B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma2(**MODEL_SIZES["gemma2_9b"].dims)


lora_gemma2_9b = lora_size_builder(gemma2_9b, lora_gemma2, MODEL_SIZES)
qlora_gemma2_9b = qlora_builder(lora_gemma2_9b)


def gemma2_27b() -> TransformerDecoder:
    """Gemma 2 27B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma2(**MODEL_SIZES["gemma2_27b"].dims)


lora_gemma2_27b = lora_size_builder(gemma2_27b, lora_gemma2, MODEL_SIZES)
qlora_gemma2_27b = qlora_builder(lora_gemma2_27b)
