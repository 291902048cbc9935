"""Llama 3: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models._parallel import base_llama_tp_plan
from tune.models.llama3 import _component_builders, _model_builders
from tune.models.llama3._component_builders import llama3, lora_llama3
from tune.models.llama3._convert_weights import llama_hf_to_tune, llama_tune_to_hf
from tune.models.llama3._model_builders import (
    llama3_8b,
    llama3_70b,
    lora_llama3_8b,
    lora_llama3_70b,
    qlora_llama3_8b,
    qlora_llama3_70b,
)
from tune.models.llama3._tokenizer import Llama3Tokenizer, llama3_special_tokens, llama3_tokenizer
from tune.registry import ModelFamily, TorchtuneLayout

# All Llama generations share Hugging Face's model_type "llama"; the llama2 family builds any of them from
# a config.json (llama_from_hf_config reads RoPE scaling and tied embeddings), so this one declares no
# from_hf_config.
FAMILY = ModelFamily(
    name="llama3",
    tokenizer=llama3_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=llama_hf_to_tune,
    tune_to_hf=llama_tune_to_hf,
    hf_model_types=("llama",),
    from_hf_config=None,
    aliases=(),
    tp_plan=base_llama_tp_plan,
    torchtune_layout=TorchtuneLayout(interleaved_rope=True),  # torchtune's RoPE here rotates interleaved pairs
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "Llama3Tokenizer",
    "base_llama_tp_plan",
    "llama3",
    "llama3_70b",
    "llama3_8b",
    "llama3_special_tokens",
    "llama3_tokenizer",
    "llama_hf_to_tune",
    "llama_tune_to_hf",
    "lora_llama3",
    "lora_llama3_70b",
    "lora_llama3_8b",
    "qlora_llama3_70b",
    "qlora_llama3_8b",
]
