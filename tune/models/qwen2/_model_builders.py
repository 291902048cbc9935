"""Qwen2 model builders: the released sizes, the architecture of Qwen2.5 (:func:`~tune.models.qwen2_5.qwen2`).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`~tune.models.qwen2_5.qwen2`) and the
Hugging Face repo whose ``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder
with fresh adapters (made by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder
is the ``lora_*`` one with ``quantize_base=True``. The 0.5B and 1.5B sizes tie their output projection to the token
embeddings, so their LoRA builders take no ``apply_lora_to_output`` (as in torchtune).
"""

from tune.models._common import LORA_HEAD, LORA_TAIL, ModelSize, lora_size_builder, qlora_builder
from tune.models.qwen2_5 import lora_qwen2, qwen2
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "qwen2_0_5b": ModelSize("Qwen/Qwen2-0.5B-Instruct", dict(
        vocab_size=151936, num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_1_5b": ModelSize("Qwen/Qwen2-1.5B-Instruct", dict(
        vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)),
    "qwen2_7b": ModelSize("Qwen/Qwen2-7B-Instruct", dict(
        vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944,
        max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False)),
}
# fmt: on

# the LoRA arguments of the sizes with a tied output: all but apply_lora_to_output
_TIED_LORA_ARGUMENTS = (*LORA_HEAD[:2], *LORA_TAIL)


def qwen2_0_5b() -> TransformerDecoder:
    """Qwen2 0.5B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_0_5b"].dims)


lora_qwen2_0_5b = lora_size_builder(qwen2_0_5b, lora_qwen2, MODEL_SIZES, lora_names=_TIED_LORA_ARGUMENTS)
qlora_qwen2_0_5b = qlora_builder(lora_qwen2_0_5b)


def qwen2_1_5b() -> TransformerDecoder:
    """Qwen2 1.5B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_1_5b"].dims)


lora_qwen2_1_5b = lora_size_builder(qwen2_1_5b, lora_qwen2, MODEL_SIZES, lora_names=_TIED_LORA_ARGUMENTS)
qlora_qwen2_1_5b = qlora_builder(lora_qwen2_1_5b)


def qwen2_7b() -> TransformerDecoder:
    """Qwen2 7B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return qwen2(**MODEL_SIZES["qwen2_7b"].dims)


lora_qwen2_7b = lora_size_builder(qwen2_7b, lora_qwen2, MODEL_SIZES)
qlora_qwen2_7b = qlora_builder(lora_qwen2_7b)
