"""Llama 4 model builders: the released sizes (their language models).

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`llama4`) and the Hugging Face repo whose
``config.json`` (its ``text_config``) they are; the builders read it. Scout: 16 experts in every layer, Llama 3 RoPE
scaling (factor 16) and q/k norm. Maverick: 128 experts in every second layer (the others dense, width 16384),
unscaled RoPE, no q/k norm. Both route each token to one expert plus the shared expert, and leave RoPE out of every
fourth layer. A ``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the
family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.llama4._component_builders import llama4, lora_llama4
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
_COMMON = dict(
    vocab_size=202048, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, head_dim=128,
    intermediate_dim=16384, moe_intermediate_dim=8192, experts_per_token=1, norm_eps=1e-5, rope_base=500_000.0,
    no_rope_layer_interval=4, attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192,
    attn_scale=0.1, tie_word_embeddings=False)
MODEL_SIZES: dict[str, ModelSize] = {
    "llama4_scout_17b_16e": ModelSize("meta-llama/Llama-4-Scout-17B-16E-Instruct", dict(
        _COMMON, num_experts=16, interleave_moe_layer_step=1, max_seq_len=10485760, rope_scale_factor=16.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=1.0, rope_old_context_len=8192, use_qk_norm=True)),
    "llama4_maverick_17b_128e": ModelSize("meta-llama/Llama-4-Maverick-17B-128E-Instruct", dict(
        _COMMON, num_experts=128, interleave_moe_layer_step=2, max_seq_len=1048576, rope_scale_factor=None,
        use_qk_norm=False)),
}
# fmt: on


def llama4_scout_17b_16e(use_grouped_mm: bool = False) -> TransformerDecoder:
    """Llama 4 Scout's language model (17B active, 16 experts, 109B in all), randomly initialised (load weights
    with a checkpointer).

    Args:
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` (no host sync) instead of a loop over
            experts. Default False.
    """
    return llama4(**MODEL_SIZES["llama4_scout_17b_16e"].dims, use_grouped_mm=use_grouped_mm)


lora_llama4_scout_17b_16e = lora_size_builder(llama4_scout_17b_16e, lora_llama4, MODEL_SIZES)
qlora_llama4_scout_17b_16e = qlora_builder(lora_llama4_scout_17b_16e)


def llama4_maverick_17b_128e(use_grouped_mm: bool = False) -> TransformerDecoder:
    """Llama 4 Maverick's language model (17B active, 128 experts, 400B in all), randomly initialised (load
    weights with a checkpointer).

    Args:
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` (no host sync) instead of a loop over
            experts. Default False.
    """
    return llama4(**MODEL_SIZES["llama4_maverick_17b_128e"].dims, use_grouped_mm=use_grouped_mm)


lora_llama4_maverick_17b_128e = lora_size_builder(llama4_maverick_17b_128e, lora_llama4, MODEL_SIZES)
qlora_llama4_maverick_17b_128e = qlora_builder(lora_llama4_maverick_17b_128e)
