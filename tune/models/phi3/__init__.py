"""Phi-3: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.phi3 import _component_builders, _model_builders
from tune.models.phi3._component_builders import lora_phi3, phi3
from tune.models.phi3._convert_weights import (
    phi3_adapter_to_peft,
    phi3_from_hf_config,
    phi3_hf_to_tune,
    phi3_peft_to_adapter,
    phi3_tune_to_hf,
)
from tune.models.phi3._model_builders import lora_phi3_mini, phi3_mini, qlora_phi3_mini
from tune.models.phi3._tokenizer import phi3_mini_tokenizer
from tune.registry import AdapterConverter, ModelFamily

FAMILY = ModelFamily(
    name="phi3",
    tokenizer=phi3_mini_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=phi3_hf_to_tune,
    tune_to_hf=phi3_tune_to_hf,
    hf_model_types=("phi3",),
    from_hf_config=phi3_from_hf_config,
    aliases=("phi3_mini",),
    # HF fuses q/k/v and gate/up, which tune keeps apart: adapters on them are fused and split on the way
    adapter_converter=AdapterConverter(to_peft=phi3_adapter_to_peft, from_peft=phi3_peft_to_adapter),
)

__all__ = [
    "lora_phi3",
    "phi3_adapter_to_peft",
    "lora_phi3_mini",
    "phi3",
    "phi3_from_hf_config",
    "phi3_hf_to_tune",
    "phi3_mini",
    "phi3_mini_tokenizer",
    "phi3_peft_to_adapter",
    "phi3_tune_to_hf",
    "qlora_phi3_mini",
]
