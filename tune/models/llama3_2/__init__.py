"""Llama 3.2 (text): builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models._parallel import base_llama_tp_plan
from tune.models.llama3 import llama3_tokenizer
from tune.models.llama3_2 import _component_builders, _model_builders
from tune.models.llama3_2._component_builders import llama3_2, llama3_2_classifier, lora_llama3_2
from tune.models.llama3_2._convert_weights import llama_hf_to_tune, llama_tune_to_hf
from tune.models.llama3_2._model_builders import (
    llama3_2_1b,
    llama3_2_3b,
    lora_llama3_2_1b,
    lora_llama3_2_3b,
    qlora_llama3_2_1b,
    qlora_llama3_2_3b,
)
from tune.registry import ModelFamily, TorchtuneLayout

# All Llama generations share Hugging Face's model_type "llama"; the llama2 family builds any of them from
# a config.json (llama_from_hf_config reads RoPE scaling and tied embeddings), so this one declares no
# from_hf_config.
FAMILY = ModelFamily(
    name="llama3_2",
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
    "llama3_2",
    "llama3_2_1b",
    "llama3_2_3b",
    "llama3_2_classifier",
    "llama3_tokenizer",
    "llama_hf_to_tune",
    "llama_tune_to_hf",
    "lora_llama3_2",
    "lora_llama3_2_1b",
    "lora_llama3_2_3b",
    "qlora_llama3_2_1b",
    "qlora_llama3_2_3b",
]
