"""Phi-4 model builders: the released size, a Phi-3 architecture (Abdin et al., 2024,
https://arxiv.org/abs/2412.08905) with grouped-query attention, a 100352-token vocabulary and RoPE theta 250000.

``MODEL_SIZES`` holds its dimensions (keyword arguments of :func:`~tune.models.phi3.phi3`) and the Hugging Face repo
whose ``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters
(made by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*``
one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.phi3 import lora_phi3, phi3
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "phi4_14b": ModelSize("microsoft/phi-4", dict(
        vocab_size=100352, num_layers=40, num_heads=40, num_kv_heads=10, embed_dim=5120, intermediate_dim=17920,
        max_seq_len=16384, norm_eps=1e-5, rope_base=250_000.0, sliding_window=None)),
}
# fmt: on


def phi4_14b() -> TransformerDecoder:
    """Phi-4 (14B), randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return phi3(**MODEL_SIZES["phi4_14b"].dims)


lora_phi4_14b = lora_size_builder(phi4_14b, lora_phi3, MODEL_SIZES)
qlora_phi4_14b = qlora_builder(lora_phi4_14b)
