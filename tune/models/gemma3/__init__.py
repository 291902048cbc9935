"""Gemma 3 (text): builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.gemma3 import _component_builders, _model_builders
from tune.models.gemma3._component_builders import gemma3, lora_gemma3
from tune.models.gemma3._convert_weights import (
    GEMMA3_PASSTHROUGH_KEYS,
    gemma3_from_hf_config,
    gemma3_hf_to_tune,
    gemma3_tune_to_hf,
)
from tune.models.gemma3._model_builders import (
    gemma3_1b,
    gemma3_4b,
    gemma3_12b,
    gemma3_27b,
    gemma3_270m,
    lora_gemma3_1b,
    lora_gemma3_4b,
    lora_gemma3_12b,
    lora_gemma3_27b,
    lora_gemma3_270m,
    qlora_gemma3_1b,
    qlora_gemma3_4b,
    qlora_gemma3_12b,
    qlora_gemma3_27b,
    qlora_gemma3_270m,
)
from tune.models.gemma3._tokenizer import gemma3_tokenizer
from tune.registry import ModelFamily

FAMILY = ModelFamily(
    name="gemma3",
    tokenizer=gemma3_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=gemma3_hf_to_tune,
    tune_to_hf=gemma3_tune_to_hf,
    # text-only checkpoints (Gemma3ForCausalLM). This family also reads the language model of a multimodal one
    # (Gemma3ForConditionalGeneration, model_type "gemma3") when a checkpointer names it; tune.models.from_hf
    # loads those whole with the gemma3_vision family.
    hf_model_types=("gemma3_text",),
    # a multimodal checkpoint's vision tower and projector: no module in tune, written back as they were read
    passthrough_hf_keys=GEMMA3_PASSTHROUGH_KEYS,
    from_hf_config=gemma3_from_hf_config,
    aliases=(),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "gemma3",
    "gemma3_12b",
    "gemma3_1b",
    "gemma3_270m",
    "gemma3_27b",
    "gemma3_4b",
    "gemma3_from_hf_config",
    "gemma3_hf_to_tune",
    "gemma3_tokenizer",
    "gemma3_tune_to_hf",
    "lora_gemma3",
    "lora_gemma3_12b",
    "lora_gemma3_1b",
    "lora_gemma3_270m",
    "lora_gemma3_27b",
    "lora_gemma3_4b",
    "qlora_gemma3_12b",
    "qlora_gemma3_1b",
    "qlora_gemma3_270m",
    "qlora_gemma3_27b",
    "qlora_gemma3_4b",
]
