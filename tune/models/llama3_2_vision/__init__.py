"""Llama 3.2 Vision (11B, 90B): builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.llama3_2_vision import _component_builders, _model_builders
from tune.models.llama3_2_vision._component_builders import (
    Llama3VisionEncoder,
    Llama3VisionProjectionHead,
    LoRATrainable,
    llama3_2_vision,
    llama3_2_vision_decoder,
    llama3_2_vision_encoder,
    lora_llama3_2_vision,
    lora_llama3_2_vision_decoder,
    lora_llama3_2_vision_encoder,
)
from tune.models.llama3_2_vision._convert_weights import (
    llama3_2_vision_adapter_to_peft,
    llama3_2_vision_from_hf_config,
    llama3_2_vision_hf_to_tune,
    llama3_2_vision_peft_to_adapter,
    llama3_2_vision_tune_to_hf,
)
from tune.models.llama3_2_vision._model_builders import (
    llama3_2_vision_11b,
    llama3_2_vision_90b,
    lora_llama3_2_vision_11b,
    lora_llama3_2_vision_90b,
    qlora_llama3_2_vision_11b,
    qlora_llama3_2_vision_90b,
)
from tune.models.llama3_2_vision._transform import Llama3VisionTransform, llama3_2_vision_transform
from tune.registry import AdapterConverter, ModelFamily

FAMILY = ModelFamily(
    name="llama3_2_vision",
    tokenizer=llama3_2_vision_transform,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=llama3_2_vision_hf_to_tune,
    tune_to_hf=llama3_2_vision_tune_to_hf,
    hf_model_types=("mllama",),
    from_hf_config=llama3_2_vision_from_hf_config,
    # torchtune's configs say model_type: LLAMA3_VISION
    aliases=("llama3_vision",),
    sizes=_model_builders.MODEL_SIZES,
    # PEFT names the adapted modules by transformers' module tree, each one in full: the frozen language model's
    # q_proj carries no adapter where the cross-attention's does
    adapter_converter=AdapterConverter(
        to_peft=llama3_2_vision_adapter_to_peft, from_peft=llama3_2_vision_peft_to_adapter, exact_targets=True
    ),
)

__all__ = [
    "Llama3VisionEncoder",
    "Llama3VisionProjectionHead",
    "Llama3VisionTransform",
    "LoRATrainable",
    "llama3_2_vision",
    "llama3_2_vision_11b",
    "llama3_2_vision_90b",
    "llama3_2_vision_adapter_to_peft",
    "llama3_2_vision_decoder",
    "llama3_2_vision_encoder",
    "llama3_2_vision_from_hf_config",
    "llama3_2_vision_hf_to_tune",
    "llama3_2_vision_peft_to_adapter",
    "llama3_2_vision_tune_to_hf",
    "llama3_2_vision_transform",
    "lora_llama3_2_vision",
    "lora_llama3_2_vision_11b",
    "lora_llama3_2_vision_90b",
    "lora_llama3_2_vision_decoder",
    "lora_llama3_2_vision_encoder",
    "qlora_llama3_2_vision_11b",
    "qlora_llama3_2_vision_90b",
]
