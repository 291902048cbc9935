"""Gemma 3 model builders: the released sizes (text decoder).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`gemma3`) and the Hugging Face repo whose
``config.json`` they are: for 270M and 1B the text-only release; for 4B, 12B and 27B the multimodal instruct
release, whose ``text_config`` (with ``Gemma3TextConfig``'s defaults for the keys it leaves out) is the language
model. Those three have 262,208 embedding rows (``Gemma3TextConfig``'s default ``vocab_size``: the 262,144 tokens of
the tokenizer plus 64 rows the checkpoints carry), 270M and 1B have 262,144. The builders read the table. A
``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the family's LoRA
component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.gemma3._component_builders import gemma3, lora_gemma3
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "gemma3_270m": ModelSize("google/gemma-3-270m", dict(
        vocab_size=262144, num_layers=18, num_heads=4, num_kv_heads=1, embed_dim=640, intermediate_dim=2048,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, rope_local_base=10_000.0, rope_scale_factor=None,
        head_dim=256, sliding_window_size=512, sliding_window_pattern=6, query_pre_attn_scalar=256)),
    "gemma3_1b": ModelSize("google/gemma-3-1b-it", dict(
        vocab_size=262144, num_layers=26, num_heads=4, num_kv_heads=1, embed_dim=1152, intermediate_dim=6912,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, rope_local_base=10_000.0, rope_scale_factor=None,
        head_dim=256, sliding_window_size=512, sliding_window_pattern=6, query_pre_attn_scalar=256)),
    "gemma3_4b": ModelSize("google/gemma-3-4b-it", dict(
        vocab_size=262208, num_layers=34, num_heads=8, num_kv_heads=4, embed_dim=2560, intermediate_dim=10240,
        max_seq_len=131072, norm_eps=1e-6, rope_base=1_000_000.0, rope_local_base=10_000.0, rope_scale_factor=8.0,
        head_dim=256, sliding_window_size=1024, sliding_window_pattern=6, query_pre_attn_scalar=256)),
    "gemma3_12b": ModelSize("google/gemma-3-12b-it", dict(
        vocab_size=262208, num_layers=48, num_heads=16, num_kv_heads=8, embed_dim=3840, intermediate_dim=15360,
        max_seq_len=131072, norm_eps=1e-6, rope_base=1_000_000.0, rope_local_base=10_000.0, rope_scale_factor=8.0,
        head_dim=256, sliding_window_size=1024, sliding_window_pattern=6, query_pre_attn_scalar=256)),
    "gemma3_27b": ModelSize("google/gemma-3-27b-it", dict(
        vocab_size=262208, num_layers=62, num_heads=32, num_kv_heads=16, embed_dim=5376, intermediate_dim=21504,
        max_seq_len=131072, norm_eps=1e-6, rope_base=1_000_000.0, rope_local_base=10_000.0, rope_scale_factor=8.0,
        head_dim=128, sliding_window_size=1024, sliding_window_pattern=6, query_pre_attn_scalar=168)),
}
# fmt: on


def gemma3_270m() -> TransformerDecoder:
    """Gemma 3 270M, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma3(**MODEL_SIZES["gemma3_270m"].dims)


lora_gemma3_270m = lora_size_builder(gemma3_270m, lora_gemma3, MODEL_SIZES)
qlora_gemma3_270m = qlora_builder(lora_gemma3_270m)


def gemma3_1b() -> TransformerDecoder:
    """Gemma 3 1B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma3(**MODEL_SIZES["gemma3_1b"].dims)


lora_gemma3_1b = lora_size_builder(gemma3_1b, lora_gemma3, MODEL_SIZES)
qlora_gemma3_1b = qlora_builder(lora_gemma3_1b)


def gemma3_4b() -> TransformerDecoder:
    """Gemma 3 4B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma3(**MODEL_SIZES["gemma3_4b"].dims)


lora_gemma3_4b = lora_size_builder(gemma3_4b, lora_gemma3, MODEL_SIZES)
qlora_gemma3_4b = qlora_builder(lora_gemma3_4b)


def gemma3_12b() -> TransformerDecoder:
    """Gemma 3 12B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma3(**MODEL_SIZES["gemma3_12b"].dims)


lora_gemma3_12b = lora_size_builder(gemma3_12b, lora_gemma3, MODEL_SIZES)
qlora_gemma3_12b = qlora_builder(lora_gemma3_12b)


def gemma3_27b() -> TransformerDecoder:
    """Gemma 3 27B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return gemma3(**MODEL_SIZES["gemma3_27b"].dims)


lora_gemma3_27b = lora_size_builder(gemma3_27b, lora_gemma3, MODEL_SIZES)
qlora_gemma3_27b = qlora_builder(lora_gemma3_27b)
