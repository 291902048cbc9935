"""Phi-4: builders, tokenizer, and the family's declaration (weights convert as Phi-3's)."""

from tune.models._family import family_builders
from tune.models.phi3 import (
    phi3_adapter_to_peft,
    phi3_hf_to_tune_from_config,
    phi3_peft_to_adapter,
    phi3_tune_to_hf_from_config,
)
from tune.models.phi4 import _model_builders
from tune.models.phi4._model_builders import lora_phi4_14b, phi4_14b, qlora_phi4_14b
from tune.models.phi4._tokenizer import Phi4ChatFormat, Phi4Tokenizer, phi4_tokenizer
from tune.registry import AdapterConverter, ModelFamily, TorchtuneLayout

# Phi-4 checkpoints say model_type "phi3" (Phi3ForCausalLM): the phi3 family builds them from a config.json, so
# this one declares no from_hf_config. The fused qkv_proj / gate_up_proj split and re-fuse as Phi-3's do.
FAMILY = ModelFamily(
    name="phi4",
    tokenizer=phi4_tokenizer,
    builders=family_builders(_model_builders),
    hf_to_tune=phi3_hf_to_tune_from_config,
    tune_to_hf=phi3_tune_to_hf_from_config,
    hf_model_types=("phi3",),
    from_hf_config=None,
    aliases=(),
    adapter_converter=AdapterConverter(to_peft=phi3_adapter_to_peft, from_peft=phi3_peft_to_adapter),
    torchtune_layout=TorchtuneLayout(interleaved_rope=False),  # torchtune's Phi-4 uses its Phi-3 (rotate_half) RoPE
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "Phi4ChatFormat",
    "Phi4Tokenizer",
    "lora_phi4_14b",
    "phi4_14b",
    "phi4_tokenizer",
    "qlora_phi4_14b",
]
