"""Qwen2.5 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`qwen2`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. Base and instruct releases of one size differ in context length and,
from 14B up, RMSNorm epsilon. A ``lora_*`` builder is the size's builder with fresh adapters (made by
``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.qwen2_5._component_builders import lora_qwen2, qwen2
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "qwen2_5_0_5b": ModelSize("Qwen/Qwen2.5-0.5B-Instruct", dict(
        vocab_size=151936, num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_5_1_5b_base": ModelSize("Qwen/Qwen2.5-1.5B", dict(
        vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960,
        max_seq_len=131072, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_5_1_5b_instruct": ModelSize("Qwen/Qwen2.5-1.5B-Instruct", dict(
        vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_5_3b": ModelSize("Qwen/Qwen2.5-3B-Instruct", dict(
        vocab_size=151936, num_layers=36, num_heads=16, num_kv_heads=2, embed_dim=2048, intermediate_dim=11008,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_5_7b_base": ModelSize("Qwen/Qwen2.5-7B", dict(
        vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944,
        max_seq_len=131072, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_7b_instruct": ModelSize("Qwen/Qwen2.5-7B-Instruct", dict(
        vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_14b_base": ModelSize("Qwen/Qwen2.5-14B", dict(
        vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824,
        max_seq_len=131072, norm_eps=1e-5, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_14b_instruct": ModelSize("Qwen/Qwen2.5-14B-Instruct", dict(
        vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_32b_base": ModelSize("Qwen/Qwen2.5-32B", dict(
        vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648,
        max_seq_len=131072, norm_eps=1e-5, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_32b_instruct": ModelSize("Qwen/Qwen2.5-32B-Instruct", dict(
        vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_72b_base": ModelSize("Qwen/Qwen2.5-72B", dict(
        vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568,
        max_seq_len=131072, norm_eps=1e-5, rope_base=1_000_000.0, tie_word_embeddings=False)),
    "qwen2_5_72b_instruct": ModelSize("Qwen/Qwen2.5-72B-Instruct", dict(
        vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
}
# fmt: on


def qwen2_5_0_5b() -> TransformerDecoder:
    """Qwen2.5 0.5B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_0_5b"].dims)


lora_qwen2_5_0_5b = lora_size_builder(qwen2_5_0_5b, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_0_5b = qlora_builder(lora_qwen2_5_0_5b)


def qwen2_5_1_5b_base() -> TransformerDecoder:
    """Qwen2.5 1.5B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_1_5b_base"].dims)


lora_qwen2_5_1_5b_base = lora_size_builder(qwen2_5_1_5b_base, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_1_5b_base = qlora_builder(lora_qwen2_5_1_5b_base)


def qwen2_5_1_5b_instruct() -> TransformerDecoder:
    """Qwen2.5 1.5B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_1_5b_instruct"].dims)


lora_qwen2_5_1_5b_instruct = lora_size_builder(qwen2_5_1_5b_instruct, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_1_5b_instruct = qlora_builder(lora_qwen2_5_1_5b_instruct)


def qwen2_5_3b() -> TransformerDecoder:
    """Qwen2.5 3B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_3b"].dims)


lora_qwen2_5_3b = lora_size_builder(qwen2_5_3b, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_3b = qlora_builder(lora_qwen2_5_3b)


def qwen2_5_7b_base() -> TransformerDecoder:
    """Qwen2.5 7B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_7b_base"].dims)


lora_qwen2_5_7b_base = lora_size_builder(qwen2_5_7b_base, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_7b_base = qlora_builder(lora_qwen2_5_7b_base)


def qwen2_5_7b_instruct() -> TransformerDecoder:
    """Qwen2.5 7B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_7b_instruct"].dims)


lora_qwen2_5_7b_instruct = lora_size_builder(qwen2_5_7b_instruct, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_7b_instruct = qlora_builder(lora_qwen2_5_7b_instruct)


def qwen2_5_14b_base() -> TransformerDecoder:
    """Qwen2.5 14B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_14b_base"].dims)


lora_qwen2_5_14b_base = lora_size_builder(qwen2_5_14b_base, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_14b_base = qlora_builder(lora_qwen2_5_14b_base)


def qwen2_5_14b_instruct() -> TransformerDecoder:
    """Qwen2.5 14B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_14b_instruct"].dims)


lora_qwen2_5_14b_instruct = lora_size_builder(qwen2_5_14b_instruct, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_14b_instruct = qlora_builder(lora_qwen2_5_14b_instruct)


def qwen2_5_32b_base() -> TransformerDecoder:
    """Qwen2.5 32B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_32b_base"].dims)


lora_qwen2_5_32b_base = lora_size_builder(qwen2_5_32b_base, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_32b_base = qlora_builder(lora_qwen2_5_32b_base)


def qwen2_5_32b_instruct() -> TransformerDecoder:
    """Qwen2.5 32B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_32b_instruct"].dims)


lora_qwen2_5_32b_instruct = lora_size_builder(qwen2_5_32b_instruct, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_32b_instruct = qlora_builder(lora_qwen2_5_32b_instruct)


def qwen2_5_72b_base() -> TransformerDecoder:
    """Qwen2.5 72B base, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_72b_base"].dims)


lora_qwen2_5_72b_base = lora_size_builder(qwen2_5_72b_base, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_72b_base = qlora_builder(lora_qwen2_5_72b_base)


def qwen2_5_72b_instruct() -> TransformerDecoder:
    """Qwen2.5 72B instruct, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_5_72b_instruct"].dims)


lora_qwen2_5_72b_instruct = lora_size_builder(qwen2_5_72b_instruct, lora_qwen2, MODEL_SIZES)
qlora_qwen2_5_72b_instruct = qlora_builder(lora_qwen2_5_72b_instruct)
