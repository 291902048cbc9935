"""Qwen3-MoE model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`qwen3_moe`) and the Hugging Face repo
whose ``config.json`` they are; the builders read it. Both sizes are sparse in every layer
(``decoder_sparse_step: 1``, ``mlp_only_layers: []``), so ``intermediate_dim`` (the dense width) is unused there.
A ``lora_*`` builder is the size's builder with fresh adapters (made by ``lora_size_builder`` from the family's
LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.qwen3_moe._component_builders import lora_qwen3_moe, qwen3_moe
from tune.modules import TransformerDecoder

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "qwen3_moe_30b_a3b": ModelSize("Qwen/Qwen3-30B-A3B", dict(
        vocab_size=151936, num_layers=48, num_heads=32, num_kv_heads=4, embed_dim=2048, intermediate_dim=6144,
        moe_intermediate_dim=768, num_experts=128, experts_per_token=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=(), max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128,
        tie_word_embeddings=False)),
    "qwen3_moe_235b_a22b": ModelSize("Qwen/Qwen3-235B-A22B", dict(
        vocab_size=151936, num_layers=94, num_heads=64, num_kv_heads=4, embed_dim=4096, intermediate_dim=12288,
        moe_intermediate_dim=1536, num_experts=128, experts_per_token=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=(), max_seq_len=40960, norm_eps=1e-6, rope_base=1_000_000.0, head_dim=128,
        tie_word_embeddings=False)),
}
# fmt: on


def qwen3_moe_30b_a3b(use_grouped_mm: bool = False) -> TransformerDecoder:
    """Qwen3-30B-A3B (128 experts, 8 active), randomly initialised (load weights with a checkpointer).

    Args:
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` (no host sync) instead of a loop over
            experts. Default False.
    """
    return qwen3_moe(**MODEL_SIZES["qwen3_moe_30b_a3b"].dims, use_grouped_mm=use_grouped_mm)


lora_qwen3_moe_30b_a3b = lora_size_builder(qwen3_moe_30b_a3b, lora_qwen3_moe, MODEL_SIZES)
qlora_qwen3_moe_30b_a3b = qlora_builder(lora_qwen3_moe_30b_a3b)


def qwen3_moe_235b_a22b(use_grouped_mm: bool = False) -> TransformerDecoder:
    """Qwen3-235B-A22B (128 experts, 8 active), randomly initialised (load weights with a checkpointer).

    Args:
        use_grouped_mm (bool): experts compute with ``torch._grouped_mm`` (no host sync) instead of a loop over
            experts. Default False.
    """
    return qwen3_moe(**MODEL_SIZES["qwen3_moe_235b_a22b"].dims, use_grouped_mm=use_grouped_mm)


lora_qwen3_moe_235b_a22b = lora_size_builder(qwen3_moe_235b_a22b, lora_qwen3_moe, MODEL_SIZES)
qlora_qwen3_moe_235b_a22b = qlora_builder(lora_qwen3_moe_235b_a22b)
