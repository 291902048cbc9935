"""Parameter-efficient fine-tuning: LoRA, DoRA, QLoRA base weights in NF4, and adapter utilities.

``LoRALinear``, ``DoRALinear`` and ``QATLoRALinear`` are explicit layers that builders put where they want adapters;
``apply_lora`` puts them on the ``nn.Linear`` layers of any model by name. The utilities find, freeze, save,
merge and disable the adapters of a model.
"""

from tune.modules.peft._adapter_utils import (
    LORA_ATTN_MODULES,
    AdapterModule,
    disable_adapter,
    get_adapter_config,
    get_adapter_params,
    get_adapter_state_dict,
    get_lora_module_names,
    get_merged_lora_ckpt,
    initialize_dora_magnitudes,
    is_adapter_key,
    merge_lora_weights,
    set_trainable_params,
    validate_lora_state_dict_load,
    validate_missing_and_unexpected_for_lora,
)
from tune.modules.peft._apply_lora import apply_lora
from tune.modules.peft._dora import DoRALinear
from tune.modules.peft._lora import LoRALinear
from tune.modules.peft._lora_experts import (
    LoRASwiGLUExperts,
    is_expert_adapter_key,
    merge_lora_experts,
    merge_lora_experts_state_dict,
)
from tune.modules.peft._nf4 import (
    NF4ShardingError,
    check_nf4_shardable,
    dequantize,
    is_nf4_tensor,
    nf4_block_sizes,
    to_nf4,
)
from tune.modules.peft._qat_lora import QATLoRALinear

__all__ = [
    "LORA_ATTN_MODULES",
    "AdapterModule",
    "DoRALinear",
    "LoRALinear",
    "LoRASwiGLUExperts",
    "NF4ShardingError",
    "QATLoRALinear",
    "apply_lora",
    "check_nf4_shardable",
    "dequantize",
    "disable_adapter",
    "get_adapter_config",
    "get_adapter_params",
    "initialize_dora_magnitudes",
    "get_adapter_state_dict",
    "get_lora_module_names",
    "get_merged_lora_ckpt",
    "is_adapter_key",
    "is_expert_adapter_key",
    "is_nf4_tensor",
    "merge_lora_experts",
    "merge_lora_experts_state_dict",
    "merge_lora_weights",
    "nf4_block_sizes",
    "set_trainable_params",
    "to_nf4",
    "validate_lora_state_dict_load",
    "validate_missing_and_unexpected_for_lora",
]
