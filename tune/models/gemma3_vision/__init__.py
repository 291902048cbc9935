"""Gemma 3 with images: SigLIP vision encoder, multimodal projector and the Gemma 3 language model; builders,
Hugging Face weight conversion, the image and model transforms, and the family's declaration.

This family loads ``Gemma3ForConditionalGeneration`` checkpoints (``model_type: gemma3``, the 4B, 12B and 27B
releases) whole, and ``tune.models.from_hf`` picks it for them. The ``gemma3`` family loads the language model of
the same checkpoints alone (``model_type: GEMMA3`` in a checkpointer), with the vision tower carried over unchanged.
"""

from tune.models._family import family_builders
from tune.models.gemma3_vision import _component_builders, _model_builders
from tune.models.gemma3_vision._component_builders import IMAGE_TOKEN_ID, gemma3_vision, lora_gemma3_vision
from tune.models.gemma3_vision._convert_weights import (
    gemma3_vision_from_hf_config,
    gemma3_vision_hf_to_tune,
    gemma3_vision_tune_to_hf,
)
from tune.models.gemma3_vision._model import Gemma3MultiModalProjector, Gemma3VisionLanguageModel, image_attention_mask
from tune.models.gemma3_vision._model_builders import (
    gemma3_vision_4b,
    gemma3_vision_12b,
    gemma3_vision_27b,
    lora_gemma3_vision_4b,
    lora_gemma3_vision_12b,
    lora_gemma3_vision_27b,
    qlora_gemma3_vision_4b,
    qlora_gemma3_vision_12b,
    qlora_gemma3_vision_27b,
)
from tune.models.gemma3_vision._transform import Gemma3ImageTransform, Gemma3VisionTransform, gemma3_vision_transform
from tune.registry import ModelFamily

FAMILY = ModelFamily(
    name="gemma3_vision",
    tokenizer=gemma3_vision_transform,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=gemma3_vision_hf_to_tune,
    tune_to_hf=gemma3_vision_tune_to_hf,
    hf_model_types=("gemma3",),
    from_hf_config=gemma3_vision_from_hf_config,
    aliases=(),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "IMAGE_TOKEN_ID",
    "Gemma3ImageTransform",
    "Gemma3MultiModalProjector",
    "Gemma3VisionLanguageModel",
    "Gemma3VisionTransform",
    "gemma3_vision",
    "gemma3_vision_12b",
    "gemma3_vision_27b",
    "gemma3_vision_4b",
    "gemma3_vision_from_hf_config",
    "gemma3_vision_hf_to_tune",
    "gemma3_vision_transform",
    "gemma3_vision_tune_to_hf",
    "image_attention_mask",
    "lora_gemma3_vision",
    "lora_gemma3_vision_12b",
    "lora_gemma3_vision_27b",
    "lora_gemma3_vision_4b",
    "qlora_gemma3_vision_12b",
    "qlora_gemma3_vision_27b",
    "qlora_gemma3_vision_4b",
]
