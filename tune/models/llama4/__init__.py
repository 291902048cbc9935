"""Llama 4 (the language model of Scout and Maverick): builders, Hugging Face weight conversion, tokenizer, and
the family's declaration."""

from tune.models._family import family_builders
from tune.models.llama4 import _component_builders, _model_builders
from tune.models.llama4._component_builders import llama4, lora_llama4
from tune.models.llama4._convert_weights import (
    LLAMA4_PASSTHROUGH_KEYS,
    llama4_adapter_to_peft,
    llama4_from_hf_config,
    llama4_hf_to_tune,
    llama4_peft_to_adapter,
    llama4_tune_to_hf,
)
from tune.models.llama4._model_builders import (
    llama4_maverick_17b_128e,
    llama4_scout_17b_16e,
    lora_llama4_maverick_17b_128e,
    lora_llama4_scout_17b_16e,
    qlora_llama4_maverick_17b_128e,
    qlora_llama4_scout_17b_16e,
)
from tune.models.llama4._tokenizer import llama4_tokenizer
from tune.registry import AdapterConverter, ModelFamily

# No tensor-parallel plan: the Llama plan shards a dense feed-forward (w1/w2/w3), which sparse layers do not have.
FAMILY = ModelFamily(
    name="llama4",
    tokenizer=llama4_tokenizer,
    builders=family_builders(_component_builders, _model_builders),
    hf_to_tune=llama4_hf_to_tune,
    tune_to_hf=llama4_tune_to_hf,
    # text-only checkpoints (Llama4ForCausalLM) and multimodal ones (Llama4ForConditionalGeneration, the hub's
    # releases), whose language model is loaded
    hf_model_types=("llama4_text", "llama4"),
    # a multimodal checkpoint's vision model and projector: no module in tune, written back as they were read
    passthrough_hf_keys=LLAMA4_PASSTHROUGH_KEYS,
    from_hf_config=llama4_from_hf_config,
    # q/k adapters: rows permuted between tune's RoPE layout and Llama 4's, as the weights are
    adapter_converter=AdapterConverter(to_peft=llama4_adapter_to_peft, from_peft=llama4_peft_to_adapter),
    aliases=(),
    sizes=_model_builders.MODEL_SIZES,
)

__all__ = [
    "LLAMA4_PASSTHROUGH_KEYS",
    "llama4",
    "llama4_from_hf_config",
    "llama4_hf_to_tune",
    "llama4_maverick_17b_128e",
    "llama4_scout_17b_16e",
    "llama4_tokenizer",
    "llama4_tune_to_hf",
    "lora_llama4",
    "lora_llama4_maverick_17b_128e",
    "lora_llama4_scout_17b_16e",
    "qlora_llama4_maverick_17b_128e",
    "qlora_llama4_scout_17b_16e",
]
