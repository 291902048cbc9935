"""Low-precision layers: a frozen linear layer with an NF4 weight (QLoRA's base-weight storage), and NF4 helpers."""

from tune.modules.low_precision._frozen_nf4_linear import (
    FrozenNF4Linear,
    reparametrize_as_dtype_state_dict_post_hook,
)
from tune.modules.low_precision._nf4 import dequantize, is_nf4_tensor, nf4_block_sizes, to_nf4

__all__ = [
    "FrozenNF4Linear",
    "dequantize",
    "is_nf4_tensor",
    "nf4_block_sizes",
    "reparametrize_as_dtype_state_dict_post_hook",
    "to_nf4",
]
