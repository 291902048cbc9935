"""Llama 2 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama2`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters (made
by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.llama2._component_builders import llama2, llama2_classifier, lora_llama2, lora_llama2_classifier
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "llama2_7b": ModelSize("meta-llama/Llama-2-7b-hf", dict(
        vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, intermediate_dim=11008,
        max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0)),
    "llama2_13b": ModelSize("meta-llama/Llama-2-13b-hf", dict(
        vocab_size=32000, num_layers=40, num_heads=40, num_kv_heads=40, embed_dim=5120, intermediate_dim=13824,
        max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0)),
    "llama2_70b": ModelSize("meta-llama/Llama-2-70b-hf", dict(
        vocab_size=32000, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672,
        max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0)),
}
# fmt: on


def llama2_7b() -> TransformerDecoder:
    """Llama 2 7B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["llama2_7b"].dims)


lora_llama2_7b = lora_size_builder(llama2_7b, lora_llama2, MODEL_SIZES)
qlora_llama2_7b = qlora_builder(lora_llama2_7b)


def llama2_13b() -> TransformerDecoder:
    """Llama 2 13B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["llama2_13b"].dims)


lora_llama2_13b = lora_size_builder(llama2_13b, lora_llama2, MODEL_SIZES)
qlora_llama2_13b = qlora_builder(lora_llama2_13b)


def llama2_70b() -> TransformerDecoder:
    """Llama 2 70B, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return llama2(**MODEL_SIZES["llama2_70b"].dims)


lora_llama2_70b = lora_size_builder(llama2_70b, lora_llama2, MODEL_SIZES)
qlora_llama2_70b = qlora_builder(lora_llama2_70b)


def _reward_7b_dims() -> dict:
    # one output, and the 7B row without rope_base (the classifier builders use Llama 2's 10000, as the row does)
    return {
        "num_classes": 1,
        **{key: value for key, value in MODEL_SIZES["llama2_7b"].dims.items() if key != "rope_base"},
    }


def llama2_reward_7b() -> TransformerDecoder:
    """Llama 2 7B with a one-output head (:func:`llama2_classifier` with ``num_classes=1``): a reward model, whose
    output at a sequence's last token is its score. Randomly initialised."""
    return llama2_classifier(**_reward_7b_dims())


lora_llama2_reward_7b = lora_size_builder(llama2_reward_7b, lora_llama2_classifier, dims=_reward_7b_dims)
qlora_llama2_reward_7b = qlora_builder(lora_llama2_reward_7b)
