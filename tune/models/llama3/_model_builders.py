"""Llama 3 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama3`) and the Hugging Face repo whose
``config.json`` they are (the instruct release; the base one has the same dimensions); the builders read it. A
``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the family's LoRA
component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import LORA_HEAD, ModelSize, lora_size_builder, qlora_builder
from tune.models.llama3._component_builders import llama3, lora_llama3
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "llama3_8b": ModelSize("meta-llama/Meta-Llama-3-8B-Instruct", dict(
        vocab_size=128256, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336,
        max_seq_len=8192, norm_eps=1e-5, rope_base=500_000.0)),
    "llama3_70b": ModelSize("meta-llama/Meta-Llama-3-70B-Instruct", dict(
        vocab_size=128256, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672,
        max_seq_len=8192, norm_eps=1e-5, rope_base=500_000.0)),
}
# fmt: on

# torchtune's Llama 3 size builders take quantize_base before use_dora
_TORCHTUNE_LORA_ORDER = (*LORA_HEAD, "lora_rank", "lora_alpha", "lora_dropout", "quantize_base", "use_dora")


def llama3_8b() -> TransformerDecoder:
    """Llama 3 8B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama3(**MODEL_SIZES["llama3_8b"].dims)


lora_llama3_8b = lora_size_builder(llama3_8b, lora_llama3, MODEL_SIZES, lora_names=_TORCHTUNE_LORA_ORDER)
qlora_llama3_8b = qlora_builder(lora_llama3_8b)


def llama3_70b() -> TransformerDecoder:
    """Llama 3 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama3(**MODEL_SIZES["llama3_70b"].dims)


lora_llama3_70b = lora_size_builder(llama3_70b, lora_llama3, MODEL_SIZES, lora_names=_TORCHTUNE_LORA_ORDER)
qlora_llama3_70b = qlora_builder(lora_llama3_70b)
