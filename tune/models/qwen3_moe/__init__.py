"""Qwen3-MoE: builders, Hugging Face weight conversion, and the family's declaration (tokenizer: Qwen3's)."""

from tune.models._family import family_builders
from tune.models.qwen3 import qwen3_tokenizer
from tune.models.qwen3_moe import _component_builders, _model_builders
from tune.models.qwen3_moe._component_builders import lora_qwen3_moe, qwen3_moe
from tune.models.qwen3_moe._convert_weights import (
    qwen3_moe_from_hf_config,
    qwen3_moe_hf_to_tune,
    qwen3_moe_tune_to_hf,
)
from tune.models.qwen3_moe._model_builders import (
    lora_qwen3_moe_30b_a3b,
    lora_qwen3_moe_235b_a22b,
    qlora_qwen3_moe_30b_a3b,
    qlora_qwen3_moe_235b_a22b,
    qwen3_moe_30b_a3b,
    qwen3_moe_235b_a22b,
)
from tune.registry import ModelFamily

# No tensor-parallel plan: Qwen's plan shards the dense feed-forward (w1/w2/w3), which sparse layers do not have.
FAMILY = ModelFamily(
    name="qwen3_moe",
    tokenizer=qwen3_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=qwen3_moe_hf_to_tune,
    tune_to_hf=qwen3_moe_tune_to_hf,
    hf_model_types=("qwen3_moe",),
    from_hf_config=qwen3_moe_from_hf_config,
    aliases=(),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "lora_qwen3_moe",
    "lora_qwen3_moe_235b_a22b",
    "lora_qwen3_moe_30b_a3b",
    "qlora_qwen3_moe_235b_a22b",
    "qlora_qwen3_moe_30b_a3b",
    "qwen3_moe",
    "qwen3_moe_235b_a22b",
    "qwen3_moe_30b_a3b",
    "qwen3_moe_from_hf_config",
    "qwen3_moe_hf_to_tune",
    "qwen3_moe_tune_to_hf",
    "qwen3_tokenizer",
]
