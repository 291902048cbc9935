"""Code Llama (Llama 2 architecture): builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models._parallel import base_llama_tp_plan
from tune.models.code_llama2 import _model_builders
from tune.models.code_llama2._model_builders import (
    code_llama2_7b,
    code_llama2_13b,
    code_llama2_70b,
    lora_code_llama2_7b,
    lora_code_llama2_13b,
    lora_code_llama2_70b,
    qlora_code_llama2_7b,
    qlora_code_llama2_13b,
    qlora_code_llama2_70b,
)
from tune.models.llama2 import llama2_tokenizer, llama_hf_to_tune, llama_tune_to_hf
from tune.registry import ModelFamily, TorchtuneLayout

# Hugging Face's model_type is "llama"; the llama2 family builds any Llama from a config.json, so this one declares
# no from_hf_config. torchtune's Code Llama configs use the Llama 2 tokenizer.
FAMILY = ModelFamily(
    name="code_llama2",
    tokenizer=llama2_tokenizer,
    builders=family_builders(_model_builders),
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
    "code_llama2_13b",
    "code_llama2_70b",
    "code_llama2_7b",
    "lora_code_llama2_13b",
    "lora_code_llama2_70b",
    "lora_code_llama2_7b",
    "qlora_code_llama2_13b",
    "qlora_code_llama2_70b",
    "qlora_code_llama2_7b",
]
