"""Mistral model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`mistral`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters (made
by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.mistral._component_builders import (
    lora_mistral,
    lora_mistral_classifier,
    mistral,
    mistral_classifier,
)
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "mistral_7b": ModelSize("mistralai/Mistral-7B-v0.1", dict(
        vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336,
        max_seq_len=32768, norm_eps=1e-5, rope_base=10_000.0, sliding_window=4096)),
    # v0.3: the v0.1 shape with a 32768-token vocabulary, RoPE theta 1e6 and no sliding window
    "mistral_7b_v0_3": ModelSize("mistralai/Mistral-7B-Instruct-v0.3", dict(
        vocab_size=32768, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336,
        max_seq_len=32768, norm_eps=1e-5, rope_base=1_000_000.0, sliding_window=None)),
    # Mistral NeMo 12B (with NVIDIA): head_dim 128, not 5120 / 32
    "mistral_nemo_12b": ModelSize("mistralai/Mistral-Nemo-Instruct-2407", dict(
        vocab_size=131072, num_layers=40, num_heads=32, num_kv_heads=8, embed_dim=5120, intermediate_dim=14336,
        max_seq_len=1024000, norm_eps=1e-5, rope_base=1_000_000.0, sliding_window=None, head_dim=128)),
}
# fmt: on


def mistral_7b() -> TransformerDecoder:
    """Mistral 7B v0.1, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return mistral(**MODEL_SIZES["mistral_7b"].dims)


lora_mistral_7b = lora_size_builder(mistral_7b, lora_mistral, MODEL_SIZES)
qlora_mistral_7b = qlora_builder(lora_mistral_7b)


def mistral_7b_v0_3() -> TransformerDecoder:
    """Mistral 7B v0.3, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return mistral(**MODEL_SIZES["mistral_7b_v0_3"].dims)


lora_mistral_7b_v0_3 = lora_size_builder(mistral_7b_v0_3, lora_mistral, MODEL_SIZES)
qlora_mistral_7b_v0_3 = qlora_builder(lora_mistral_7b_v0_3)


def mistral_nemo_12b() -> TransformerDecoder:
    """Mistral NeMo 12B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return mistral(**MODEL_SIZES["mistral_nemo_12b"].dims)


lora_mistral_nemo_12b = lora_size_builder(mistral_nemo_12b, lora_mistral, MODEL_SIZES)
qlora_mistral_nemo_12b = qlora_builder(lora_mistral_nemo_12b)


def _reward_7b_dims() -> dict:
    # torchtune's Mistral reward model: the 7B dimensions with full attention (no sliding window)
    return {"num_classes": 1, **{k: v for k, v in MODEL_SIZES["mistral_7b"].dims.items() if k != "sliding_window"}}


def mistral_reward_7b() -> TransformerDecoder:
    """Mistral 7B with a one-output head (:func:`mistral_classifier` with ``num_classes=1``) and full attention:
    a reward model, whose output at a sequence's last token is its score. Randomly initialised."""
    return mistral_classifier(**_reward_7b_dims())


lora_mistral_reward_7b = lora_size_builder(mistral_reward_7b, lora_mistral_classifier, dims=_reward_7b_dims)
qlora_mistral_reward_7b = qlora_builder(lora_mistral_reward_7b)
