"""NF4 helpers for QLoRA, kept under their ``tune.modules.peft`` names; they live in
``tune.modules.low_precision`` next to :class:`~tune.modules.low_precision.FrozenNF4Linear`."""

from tune.modules.low_precision._nf4 import (
    NF4ShardingError,
    check_nf4_shardable,
    dequantize,
    is_nf4_tensor,
    nf4_block_sizes,
    quantize_loaded_base_weight,
    to_nf4,
)

__all__ = [
    "NF4ShardingError",
    "check_nf4_shardable",
    "dequantize",
    "is_nf4_tensor",
    "nf4_block_sizes",
    "quantize_loaded_base_weight",
    "to_nf4",
]
