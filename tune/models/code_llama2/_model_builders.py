"""Code Llama model builders: the released sizes, a Llama 2 architecture (Roziere et al., 2023,
https://arxiv.org/abs/2308.12950) with a 16k context, RoPE theta 1e6 and 16 extra tokens (infilling).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`~tune.models.llama2.llama2`) and the
Hugging Face repo whose ``config.json`` they are; the builders read it. A ``lora_*`` builder passes its own
arguments on with ``**locals()`` (its first statement, so nothing but its parameters is there); a ``qlora_*``
builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from collections.abc import Sequence

from tune.models._common import ModelSize, qlora_builder
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


def lora_code_llama2_7b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Code Llama 7B with fresh LoRA adapters (:func:`~tune.models.llama2.lora_llama2` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
            quantize_base: as in :func:`~tune.models.llama2.lora_llama2`.
    """
    return lora_llama2(**locals(), **MODEL_SIZES["code_llama2_7b"].dims)


qlora_code_llama2_7b = qlora_builder(lora_code_llama2_7b)


def code_llama2_13b() -> TransformerDecoder:
    """Code Llama 13B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["code_llama2_13b"].dims)


def lora_code_llama2_13b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Code Llama 13B with fresh LoRA adapters (:func:`~tune.models.llama2.lora_llama2` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
            quantize_base: as in :func:`~tune.models.llama2.lora_llama2`.
    """
    return lora_llama2(**locals(), **MODEL_SIZES["code_llama2_13b"].dims)


qlora_code_llama2_13b = qlora_builder(lora_code_llama2_13b)


def code_llama2_70b() -> TransformerDecoder:
    """Code Llama 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["code_llama2_70b"].dims)


def lora_code_llama2_70b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Code Llama 70B with fresh LoRA adapters (:func:`~tune.models.llama2.lora_llama2` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
            quantize_base: as in :func:`~tune.models.llama2.lora_llama2`.
    """
    return lora_llama2(**locals(), **MODEL_SIZES["code_llama2_70b"].dims)


qlora_code_llama2_70b = qlora_builder(lora_code_llama2_70b)
