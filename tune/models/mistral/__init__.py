"""Mistral: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.data._prompt_templates import MistralChatTemplate
from tune.models._family import family_builders
from tune.models._parallel import base_llama_tp_plan
from tune.models.mistral import _component_builders, _model_builders
from tune.models.mistral._component_builders import lora_mistral, lora_mistral_classifier, mistral, mistral_classifier
from tune.models.mistral._convert_weights import mistral_from_hf_config, mistral_hf_to_tune, mistral_tune_to_hf
from tune.models.mistral._model_builders import (
    lora_mistral_7b,
    lora_mistral_7b_v0_3,
    lora_mistral_nemo_12b,
    lora_mistral_reward_7b,
    mistral_7b,
    mistral_7b_v0_3,
    mistral_nemo_12b,
    mistral_reward_7b,
    qlora_mistral_7b,
    qlora_mistral_7b_v0_3,
    qlora_mistral_nemo_12b,
    qlora_mistral_reward_7b,
)
from tune.models.mistral._tekken import MistralNemoChatFormat, mistral_nemo_tokenizer
from tune.models.mistral._tokenizer import MistralTokenizer, MistralV3ChatFormat, mistral_tokenizer
from tune.registry import ModelFamily, TorchtuneLayout

FAMILY = ModelFamily(
    name="mistral",
    tokenizer=mistral_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=mistral_hf_to_tune,
    tune_to_hf=mistral_tune_to_hf,
    hf_model_types=("mistral",),
    from_hf_config=mistral_from_hf_config,
    aliases=(),
    tp_plan=base_llama_tp_plan,
    torchtune_layout=TorchtuneLayout(interleaved_rope=True),  # torchtune's RoPE here rotates interleaved pairs
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "lora_mistral_classifier",
    "lora_mistral_reward_7b",
    "mistral_classifier",
    "mistral_reward_7b",
    "qlora_mistral_reward_7b",
    "MistralChatTemplate",
    "MistralTokenizer",
    "MistralV3ChatFormat",
    "lora_mistral",
    "lora_mistral_7b",
    "mistral",
    "mistral_7b",
    "mistral_from_hf_config",
    "mistral_hf_to_tune",
    "mistral_tokenizer",
    "mistral_tune_to_hf",
    "qlora_mistral_7b",
    "mistral_7b_v0_3",
    "lora_mistral_7b_v0_3",
    "qlora_mistral_7b_v0_3",
    "mistral_nemo_12b",
    "lora_mistral_nemo_12b",
    "qlora_mistral_nemo_12b",
    "MistralNemoChatFormat",
    "mistral_nemo_tokenizer",
]
