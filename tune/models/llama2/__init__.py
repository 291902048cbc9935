"""Llama 2: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.data._prompt_templates import Llama2ChatTemplate
from tune.models._family import family_builders
from tune.models._parallel import base_llama_tp_plan
from tune.models.llama2 import _component_builders, _model_builders
from tune.models.llama2._component_builders import llama2, llama2_classifier, lora_llama2, lora_llama2_classifier
from tune.models.llama2._convert_weights import llama_from_hf_config, llama_hf_to_tune, llama_tune_to_hf
from tune.models.llama2._model_builders import (
    llama2_7b,
    llama2_13b,
    llama2_70b,
    llama2_reward_7b,
    lora_llama2_7b,
    lora_llama2_13b,
    lora_llama2_70b,
    lora_llama2_reward_7b,
    qlora_llama2_7b,
    qlora_llama2_13b,
    qlora_llama2_70b,
    qlora_llama2_reward_7b,
)
from tune.models.llama2._tokenizer import Llama2Tokenizer, llama2_tokenizer
from tune.registry import ModelFamily, TorchtuneLayout

FAMILY = ModelFamily(
    name="llama2",
    tokenizer=llama2_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=llama_hf_to_tune,
    tune_to_hf=llama_tune_to_hf,
    hf_model_types=("llama",),
    from_hf_config=llama_from_hf_config,
    aliases=(),
    tp_plan=base_llama_tp_plan,
    torchtune_layout=TorchtuneLayout(interleaved_rope=True),  # torchtune's RoPE here rotates interleaved pairs
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "llama2_classifier",
    "llama2_reward_7b",
    "lora_llama2_classifier",
    "lora_llama2_reward_7b",
    "qlora_llama2_reward_7b",
    "Llama2ChatTemplate",
    "Llama2Tokenizer",
    "llama2",
    "llama2_13b",
    "llama2_70b",
    "llama2_7b",
    "llama2_tokenizer",
    "llama_from_hf_config",
    "llama_hf_to_tune",
    "llama_tune_to_hf",
    "lora_llama2",
    "lora_llama2_13b",
    "lora_llama2_70b",
    "lora_llama2_7b",
    "qlora_llama2_13b",
    "qlora_llama2_70b",
    "qlora_llama2_7b",
]
