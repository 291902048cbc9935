"""Phi-3: builders, Hugging Face weight conversion, and the family's declaration."""

from tune.models._family import family_builders
from tune.models.phi3 import _component_builders, _model_builders
from tune.models.phi3._component_builders import lora_phi3, phi3
from tune.models.phi3._convert_weights import (
    phi3_adapter_to_peft,
    phi3_from_hf_config,
    phi3_hf_to_tune,
    phi3_hf_to_tune_from_config,
    phi3_long_rope_settings,
    phi3_peft_to_adapter,
    phi3_tune_to_hf,
    phi3_tune_to_hf_from_config,
)
from tune.models.phi3._model_builders import (
    lora_phi3_mini,
    lora_phi3_mini_128k,
    phi3_mini,
    phi3_mini_128k,
    qlora_phi3_mini,
    qlora_phi3_mini_128k,
)
from tune.models.phi3._tokenizer import Phi3MiniTokenizer, phi3_mini_tokenizer
from tune.modules import RotaryPositionalEmbeddings
from tune.registry import AdapterConverter, ModelFamily, TorchtuneLayout

# torchtune's Phi-3 RoPE is the rotate-half RoPE tune uses everywhere (same arguments, same values): one module
Phi3RotaryPositionalEmbeddings = RotaryPositionalEmbeddings

FAMILY = ModelFamily(
    name="phi3",
    tokenizer=phi3_mini_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    # the public converters keep torchtune's arguments; the registry's take the config.json dict
    hf_to_tune=phi3_hf_to_tune_from_config,
    tune_to_hf=phi3_tune_to_hf_from_config,
    hf_model_types=("phi3",),
    from_hf_config=phi3_from_hf_config,
    aliases=("phi3_mini",),
    # HF fuses q/k/v and gate/up, which tune keeps apart: adapters on them are fused and split on the way
    adapter_converter=AdapterConverter(to_peft=phi3_adapter_to_peft, from_peft=phi3_peft_to_adapter),
    torchtune_layout=TorchtuneLayout(interleaved_rope=False),  # torchtune's RoPE here is rotate_half too
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "Phi3RotaryPositionalEmbeddings",
    "Phi3MiniTokenizer",
    "lora_phi3",
    "phi3_adapter_to_peft",
    "lora_phi3_mini",
    "lora_phi3_mini_128k",
    "phi3",
    "phi3_from_hf_config",
    "phi3_hf_to_tune",
    "phi3_hf_to_tune_from_config",
    "phi3_long_rope_settings",
    "phi3_mini",
    "phi3_mini_128k",
    "phi3_mini_tokenizer",
    "phi3_peft_to_adapter",
    "phi3_tune_to_hf",
    "phi3_tune_to_hf_from_config",
    "qlora_phi3_mini",
    "qlora_phi3_mini_128k",
]
