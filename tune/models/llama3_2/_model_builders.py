"""Llama 3.2 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama3_2`) and the Hugging Face repo whose
``config.json`` they are (the instruct release; the base one has the same dimensions); the builders read it. A
``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the family's LoRA
component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.llama3_2._component_builders import llama3_2, lora_llama3_2
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "llama3_2_1b": ModelSize("meta-llama/Llama-3.2-1B-Instruct", dict(
        vocab_size=128256, num_layers=16, num_heads=32, num_kv_heads=8, embed_dim=2048, intermediate_dim=8192,
        max_seq_len=131072, norm_eps=1e-5, rope_base=500_000.0, scale_factor=32.0, tie_word_embeddings=True)),
    "llama3_2_3b": ModelSize("meta-llama/Llama-3.2-3B-Instruct", dict(
        vocab_size=128256, num_layers=28, num_heads=24, num_kv_heads=8, embed_dim=3072, intermediate_dim=8192,
        max_seq_len=131072, norm_eps=1e-5, rope_base=500_000.0, scale_factor=32.0, tie_word_embeddings=True)),
}
# fmt: on


def llama3_2_1b(tie_word_embeddings: bool = True) -> TransformerDecoder:
    """Llama 3.2 1B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``).

    Args:
        tie_word_embeddings (bool): the output projection reuses the token embeddings, as released. Default True.
    """
    return llama3_2(**{**MODEL_SIZES["llama3_2_1b"].dims, "tie_word_embeddings": tie_word_embeddings})


lora_llama3_2_1b = lora_size_builder(llama3_2_1b, lora_llama3_2, MODEL_SIZES)
qlora_llama3_2_1b = qlora_builder(lora_llama3_2_1b)


def llama3_2_3b(tie_word_embeddings: bool = True) -> TransformerDecoder:
    """Llama 3.2 3B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``).

    Args:
        tie_word_embeddings (bool): the output projection reuses the token embeddings, as released. Default True.
    """
    return llama3_2(**{**MODEL_SIZES["llama3_2_3b"].dims, "tie_word_embeddings": tie_word_embeddings})


lora_llama3_2_3b = lora_size_builder(llama3_2_3b, lora_llama3_2, MODEL_SIZES)
qlora_llama3_2_3b = qlora_builder(lora_llama3_2_3b)
