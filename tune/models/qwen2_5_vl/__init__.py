"""Qwen2.5-VL: vision encoder, M-RoPE language model, builders, Hugging Face weight conversion, and the family's
declaration."""

from tune.models._family import family_builders
from tune.models.qwen2_5_vl import _component_builders, _model_builders
from tune.models.qwen2_5_vl._component_builders import lora_qwen2_5_vl, qwen2_5_vl, qwen2_5_vl_vision_encoder
from tune.models.qwen2_5_vl._convert_weights import (
    qwen2_5_vl_adapter_to_peft,
    qwen2_5_vl_from_hf_config,
    qwen2_5_vl_hf_to_tune,
    qwen2_5_vl_peft_to_adapter,
    qwen2_5_vl_tune_to_hf,
)
from tune.models.qwen2_5_vl._model import Qwen2_5_VisionLanguageModel, mrope_positions
from tune.models.qwen2_5_vl._model_builders import (
    lora_qwen2_5_vl_3b,
    lora_qwen2_5_vl_7b,
    lora_qwen2_5_vl_32b,
    lora_qwen2_5_vl_72b,
    qlora_qwen2_5_vl_3b,
    qlora_qwen2_5_vl_7b,
    qlora_qwen2_5_vl_32b,
    qlora_qwen2_5_vl_72b,
    qwen2_5_vl_3b,
    qwen2_5_vl_7b,
    qwen2_5_vl_32b,
    qwen2_5_vl_72b,
)
from tune.models.qwen2_5_vl._transform import (
    Qwen2_5_VLImageTransform,
    Qwen2_5_VLTransform,
    qwen2_5_vl_transform,
    smart_resize,
)
from tune.registry import AdapterConverter, ModelFamily

FAMILY = ModelFamily(
    name="qwen2_5_vl",
    # Qwen2.5's tokenizer for now: the vocabulary and special tokens (<|image_pad|>, <|vision_start|>, ...) are
    # the same
    tokenizer=qwen2_5_vl_transform,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=qwen2_5_vl_hf_to_tune,
    tune_to_hf=qwen2_5_vl_tune_to_hf,
    hf_model_types=("qwen2_5_vl",),
    from_hf_config=qwen2_5_vl_from_hf_config,
    # PEFT names modules by transformers' module tree, whose vision tower has gate/up/down_proj of its own
    adapter_converter=AdapterConverter(
        to_peft=qwen2_5_vl_adapter_to_peft, from_peft=qwen2_5_vl_peft_to_adapter, exact_targets=True
    ),
    aliases=(),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "Qwen2_5_VLImageTransform",
    "Qwen2_5_VLTransform",
    "qwen2_5_vl_transform",
    "smart_resize",
    "Qwen2_5_VisionLanguageModel",
    "lora_qwen2_5_vl",
    "lora_qwen2_5_vl_32b",
    "lora_qwen2_5_vl_3b",
    "lora_qwen2_5_vl_72b",
    "lora_qwen2_5_vl_7b",
    "mrope_positions",
    "qlora_qwen2_5_vl_32b",
    "qlora_qwen2_5_vl_3b",
    "qlora_qwen2_5_vl_72b",
    "qlora_qwen2_5_vl_7b",
    "qwen2_5_vl",
    "qwen2_5_vl_32b",
    "qwen2_5_vl_3b",
    "qwen2_5_vl_72b",
    "qwen2_5_vl_7b",
    "qwen2_5_vl_adapter_to_peft",
    "qwen2_5_vl_from_hf_config",
    "qwen2_5_vl_hf_to_tune",
    "qwen2_5_vl_peft_to_adapter",
    "qwen2_5_vl_tune_to_hf",
    "qwen2_5_vl_vision_encoder",
]
