"""Qwen3 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`qwen3`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. Base and instruct releases of one size differ only in context
length. A ``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the
family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.qwen3._component_builders import lora_qwen3, qwen3
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "qwen3_0_6b_base": ModelSize("Qwen/Qwen3-0.6B-Base", dict(
        vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_0_6b_instruct": ModelSize("Qwen/Qwen3-0.6B", dict(
        vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_1_7b_base": ModelSize("Qwen/Qwen3-1.7B-Base", dict(
        vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_1_7b_instruct": ModelSize("Qwen/Qwen3-1.7B", dict(
        vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_4b_base": ModelSize("Qwen/Qwen3-4B-Base", dict(
        vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_4b_instruct": ModelSize("Qwen/Qwen3-4B", dict(
        vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=True)),
    "qwen3_8b_base": ModelSize("Qwen/Qwen3-8B-Base", dict(
        vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=False)),
    "qwen3_8b_instruct": ModelSize("Qwen/Qwen3-8B", dict(
        vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=False)),
    "qwen3_14b_base": ModelSize("Qwen/Qwen3-14B-Base", dict(
        vocab_size=151936, num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=False)),
    "qwen3_14b_instruct": ModelSize("Qwen/Qwen3-14B", dict(
        vocab_size=151936, num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=False)),
    "qwen3_32b": ModelSize("Qwen/Qwen3-32B", dict(
        vocab_size=151936, num_layers=64, num_heads=64, num_kv_heads=8, embed_dim=5120, intermediate_dim=25600,
        max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128, tie_word_embeddings=False)),
}
# fmt: on


def qwen3_0_6b_base() -> TransformerDecoder:
    """Qwen3 0.6B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_0_6b_base"].dims)


lora_qwen3_0_6b_base = lora_size_builder(qwen3_0_6b_base, lora_qwen3, MODEL_SIZES)
qlora_qwen3_0_6b_base = qlora_builder(lora_qwen3_0_6b_base)


def qwen3_0_6b_instruct() -> TransformerDecoder:
    """Qwen3 0.6B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_0_6b_instruct"].dims)


lora_qwen3_0_6b_instruct = lora_size_builder(qwen3_0_6b_instruct, lora_qwen3, MODEL_SIZES)
qlora_qwen3_0_6b_instruct = qlora_builder(lora_qwen3_0_6b_instruct)


def qwen3_1_7b_base() -> TransformerDecoder:
    """Qwen3 1.7B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_1_7b_base"].dims)


lora_qwen3_1_7b_base = lora_size_builder(qwen3_1_7b_base, lora_qwen3, MODEL_SIZES)
qlora_qwen3_1_7b_base = qlora_builder(lora_qwen3_1_7b_base)


def qwen3_1_7b_instruct() -> TransformerDecoder:
    """Qwen3 1.7B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_1_7b_instruct"].dims)


lora_qwen3_1_7b_instruct = lora_size_builder(qwen3_1_7b_instruct, lora_qwen3, MODEL_SIZES)
qlora_qwen3_1_7b_instruct = qlora_builder(lora_qwen3_1_7b_instruct)


def qwen3_4b_base() -> TransformerDecoder:
    """Qwen3 4B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_4b_base"].dims)


lora_qwen3_4b_base = lora_size_builder(qwen3_4b_base, lora_qwen3, MODEL_SIZES)
qlora_qwen3_4b_base = qlora_builder(lora_qwen3_4b_base)


def qwen3_4b_instruct() -> TransformerDecoder:
    """Qwen3 4B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_4b_instruct"].dims)


lora_qwen3_4b_instruct = lora_size_builder(qwen3_4b_instruct, lora_qwen3, MODEL_SIZES)
qlora_qwen3_4b_instruct = qlora_builder(lora_qwen3_4b_instruct)


def qwen3_8b_base() -> TransformerDecoder:
    """Qwen3 8B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_8b_base"].dims)


lora_qwen3_8b_base = lora_size_builder(qwen3_8b_base, lora_qwen3, MODEL_SIZES)
qlora_qwen3_8b_base = qlora_builder(lora_qwen3_8b_base)


def qwen3_8b_instruct() -> TransformerDecoder:
    """Qwen3 8B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_8b_instruct"].dims)


lora_qwen3_8b_instruct = lora_size_builder(qwen3_8b_instruct, lora_qwen3, MODEL_SIZES)
qlora_qwen3_8b_instruct = qlora_builder(lora_qwen3_8b_instruct)


def qwen3_14b_base() -> TransformerDecoder:
    """Qwen3 14B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_14b_base"].dims)


lora_qwen3_14b_base = lora_size_builder(qwen3_14b_base, lora_qwen3, MODEL_SIZES)
qlora_qwen3_14b_base = qlora_builder(lora_qwen3_14b_base)


def qwen3_14b_instruct() -> TransformerDecoder:
    """Qwen3 14B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_14b_instruct"].dims)


lora_qwen3_14b_instruct = lora_size_builder(qwen3_14b_instruct, lora_qwen3, MODEL_SIZES)
qlora_qwen3_14b_instruct = qlora_builder(lora_qwen3_14b_instruct)


def qwen3_32b() -> TransformerDecoder:
    """Qwen3 32B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen3(**MODEL_SIZES["qwen3_32b"].dims)


lora_qwen3_32b = lora_size_builder(qwen3_32b, lora_qwen3, MODEL_SIZES)
qlora_qwen3_32b = qlora_builder(lora_qwen3_32b)
