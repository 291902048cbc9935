"""Mistral: builders, Hugging Face weight conversion, and the family's entry in ``tune.registry``."""

from tune.models.mistral._component_builders import lora_mistral, mistral
from tune.models.mistral._convert_weights import mistral_from_hf_config, mistral_hf_to_tune, mistral_tune_to_hf
from tune.models.mistral._model_builders import lora_mistral_7b, mistral_7b, qlora_mistral_7b
from tune.models.mistral._tokenizer import mistral_tokenizer
from tune.models._parallel import base_llama_tp_plan
from tune.registry import ModelFamily, register_model_family

register_model_family(
    ModelFamily(
        name="mistral",
        tokenizer=mistral_tokenizer,
        builders={
            "mistral": mistral,
            "lora_mistral": lora_mistral,
            "mistral_7b": mistral_7b,
            "lora_mistral_7b": lora_mistral_7b,
            "qlora_mistral_7b": qlora_mistral_7b,
        },
        hf_to_tune=mistral_hf_to_tune,
        tune_to_hf=mistral_tune_to_hf,
        hf_model_types=("mistral",),
        from_hf_config=mistral_from_hf_config,
        aliases=(),
        tp_plan=base_llama_tp_plan,
    )
)

__all__ = [
    "lora_mistral",
    "lora_mistral_7b",
    "mistral",
    "mistral_7b",
    "mistral_from_hf_config",
    "mistral_hf_to_tune",
    "mistral_tokenizer",
    "mistral_tune_to_hf",
    "qlora_mistral_7b",
]
