"""Llama 3 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama3`) and the Hugging Face repo whose
``config.json`` they are (the instruct release; the base one has the same dimensions); the builders read it. A
``lora_*`` builder passes its own arguments on with ``**locals()`` (its first statement, so nothing but its
parameters is there); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from collections.abc import Sequence

from tune.models._common import ModelSize, qlora_builder
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


def llama3_8b() -> TransformerDecoder:
    """Llama 3 8B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama3(**MODEL_SIZES["llama3_8b"].dims)


def lora_llama3_8b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    quantize_base: bool = False,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Llama 3 8B with fresh LoRA adapters (:func:`lora_llama3` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout,
            quantize_base, use_dora: as in :func:`lora_llama3` (torchtune's order: quantize_base before use_dora).
    """
    return lora_llama3(**locals(), **MODEL_SIZES["llama3_8b"].dims)


qlora_llama3_8b = qlora_builder(lora_llama3_8b)


def llama3_70b() -> TransformerDecoder:
    """Llama 3 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama3(**MODEL_SIZES["llama3_70b"].dims)


def lora_llama3_70b(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    quantize_base: bool = False,
    use_dora: bool = False,
) -> TransformerDecoder:
    """Llama 3 70B with fresh LoRA adapters (:func:`lora_llama3` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout,
            quantize_base, use_dora: as in :func:`lora_llama3` (torchtune's order: quantize_base before use_dora).
    """
    return lora_llama3(**locals(), **MODEL_SIZES["llama3_70b"].dims)


qlora_llama3_70b = qlora_builder(lora_llama3_70b)
