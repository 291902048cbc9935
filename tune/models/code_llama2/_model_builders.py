"""Code Llama model builders: the released sizes, a Llama 2 architecture (Roziere et al., 2023,
https://arxiv.org/abs/2308.12950) with a 16k context, RoPE theta 1e6 and 16 extra tokens (infilling).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`~tune.models.llama2.llama2`) and the
Hugging Face repo whose ``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder
with fresh adapters (made by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder
is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.llama2 import llama2, lora_llama2
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "code_llama2_7b": ModelSize("codellama/CodeLlama-7b-hf", dict(
        vocab_size=32016, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, intermediate_dim=11008,
        max_seq_len=16384, norm_eps=1e-5, rope_base=1_000_000.0)),
    "code_llama2_13b": ModelSize("codellama/CodeLlama-13b-hf", dict(
        vocab_size=32016, num_layers=40, num_heads=40, num_kv_heads=40, embed_dim=5120, intermediate_dim=13824,
        max_seq_len=16384, norm_eps=1e-5, rope_base=1_000_000.0)),
    "code_llama2_70b": ModelSize("codellama/CodeLlama-70b-hf", dict(
        vocab_size=32016, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672,
        max_seq_len=16384, norm_eps=1e-5, rope_base=1_000_000.0)),
}
# fmt: on


def code_llama2_7b() -> TransformerDecoder:
    """Code Llama 7B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["code_llama2_7b"].dims)


lora_code_llama2_7b = lora_size_builder(code_llama2_7b, lora_llama2, MODEL_SIZES)
qlora_code_llama2_7b = qlora_builder(lora_code_llama2_7b)


def code_llama2_13b() -> TransformerDecoder:
    """Code Llama 13B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["code_llama2_13b"].dims)


lora_code_llama2_13b = lora_size_builder(code_llama2_13b, lora_llama2, MODEL_SIZES)
qlora_code_llama2_13b = qlora_builder(lora_code_llama2_13b)


def code_llama2_70b() -> TransformerDecoder:
    """Code Llama 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["code_llama2_70b"].dims)


lora_code_llama2_70b = lora_size_builder(code_llama2_70b, lora_llama2, MODEL_SIZES)
qlora_code_llama2_70b = qlora_builder(lora_code_llama2_70b)
