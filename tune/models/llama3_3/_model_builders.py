"""Llama 3.3 model builders: the released size, a Llama 3.1 architecture.

``MODEL_SIZES`` holds its dimensions (keyword arguments of :func:`llama3_1`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters (made
by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.llama3_1 import llama3_1, lora_llama3_1
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "llama3_3_70b": ModelSize("meta-llama/Llama-3.3-70B-Instruct", dict(
        vocab_size=128256, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672,
        max_seq_len=131072, norm_eps=1e-5, rope_base=500_000.0)),
}
# fmt: on


def llama3_3_70b() -> TransformerDecoder:
    """Llama 3.3 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama3_1(**MODEL_SIZES["llama3_3_70b"].dims)


lora_llama3_3_70b = lora_size_builder(llama3_3_70b, lora_llama3_1, MODEL_SIZES)
qlora_llama3_3_70b = qlora_builder(lora_llama3_3_70b)
