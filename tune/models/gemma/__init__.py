"""Gemma (the first generation: 2B and 7B): builders, tokenizer, Hugging Face weight conversion, and the family's
declaration. The tokenizer is shared with Gemma 2 (``tune.models.gemma2`` uses :class:`GemmaTokenizer`)."""

from tune.models._family import family_builders
from tune.models.gemma import _component_builders, _model_builders
from tune.models.gemma._component_builders import gemma, lora_gemma
from tune.models.gemma._convert_weights import gemma_from_hf_config, gemma_hf_to_tune, gemma_tune_to_hf
from tune.models.gemma._model_builders import (
    gemma_2b,
    gemma_7b,
    lora_gemma_2b,
    lora_gemma_7b,
    qlora_gemma_2b,
    qlora_gemma_7b,
)
from tune.models.gemma._tokenizer import GemmaTokenizer, gemma_tokenizer
from tune.registry import ModelFamily, TorchtuneLayout

FAMILY = ModelFamily(
    name="gemma",
    tokenizer=gemma_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=gemma_hf_to_tune,
    tune_to_hf=gemma_tune_to_hf,
    hf_model_types=("gemma",),
    from_hf_config=gemma_from_hf_config,
    aliases=(),
    # torchtune's Gemma rotates interleaved pairs (its converter permutes q/k as for Llama); its module names are
    # tune's (the final norm is `norm`, not wrapped as in its Gemma 2)
    torchtune_layout=TorchtuneLayout(interleaved_rope=True),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "GemmaTokenizer",
    "gemma",
    "gemma_2b",
    "gemma_7b",
    "gemma_from_hf_config",
    "gemma_hf_to_tune",
    "gemma_tokenizer",
    "gemma_tune_to_hf",
    "lora_gemma",
    "lora_gemma_2b",
    "lora_gemma_7b",
    "qlora_gemma_2b",
    "qlora_gemma_7b",
]
