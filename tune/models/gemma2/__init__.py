"""Gemma 2: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.gemma2 import _component_builders, _model_builders
from tune.models.gemma2._component_builders import gemma2, lora_gemma2
from tune.models.gemma2._convert_weights import gemma2_from_hf_config, gemma2_hf_to_tune, gemma2_tune_to_hf
from tune.models.gemma2._model_builders import (
    gemma2_2b,
    gemma2_9b,
    gemma2_27b,
    lora_gemma2_2b,
    lora_gemma2_9b,
    lora_gemma2_27b,
    qlora_gemma2_2b,
    qlora_gemma2_9b,
    qlora_gemma2_27b,
)
from tune.models.gemma2._tokenizer import GemmaTokenizer, gemma2_tokenizer, gemma_tokenizer
from tune.registry import ModelFamily

FAMILY = ModelFamily(
    name="gemma2",
    tokenizer=gemma2_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=gemma2_hf_to_tune,
    tune_to_hf=gemma2_tune_to_hf,
    hf_model_types=("gemma2",),
    from_hf_config=gemma2_from_hf_config,
    aliases=(),
)

__all__ = [
    "GemmaTokenizer",
    "gemma2",
    "gemma2_27b",
    "gemma2_2b",
    "gemma2_9b",
    "gemma2_from_hf_config",
    "gemma2_hf_to_tune",
    "gemma2_tokenizer",
    "gemma2_tune_to_hf",
    "gemma_tokenizer",
    "lora_gemma2",
    "lora_gemma2_27b",
    "lora_gemma2_2b",
    "lora_gemma2_9b",
    "qlora_gemma2_27b",
    "qlora_gemma2_2b",
    "qlora_gemma2_9b",
]
