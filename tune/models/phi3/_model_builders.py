"""Phi-3 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`phi3`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. A ``lora_*`` builder passes its own arguments on with
``**locals()`` (its first statement, so nothing but its parameters is there); a ``qlora_*`` builder is the
``lora_*`` one with ``quantize_base=True``.
"""

from collections.abc import Sequence

from tune.models._common import ModelSize, qlora_builder
from tune.models.phi3._component_builders import lora_phi3, phi3
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "phi3_mini": ModelSize("microsoft/Phi-3-mini-4k-instruct", dict(
        vocab_size=32064, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072, intermediate_dim=8192,
        max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0, sliding_window=2047)),
}
# fmt: on


def phi3_mini() -> TransformerDecoder:
    """Phi-3-mini-4k, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return phi3(**MODEL_SIZES["phi3_mini"].dims)


def lora_phi3_mini(
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """Phi-3-mini-4k with fresh LoRA adapters (:func:`lora_phi3` at this size).

    Args:
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
            quantize_base: as in :func:`lora_phi3`.
    """
    return lora_phi3(**locals(), **MODEL_SIZES["phi3_mini"].dims)


qlora_phi3_mini = qlora_builder(lora_phi3_mini)
