"""Qwen2: torchtune's ``qwen2`` names (sizes 0.5B, 1.5B and 7B, tokenizer, converters) on the Qwen2.5 family.

Qwen2 and Qwen2.5 are one architecture (Hugging Face ``model_type: qwen2``; torchtune's checkpointers call both
``QWEN2``), so this package is not a model family of its own: it declares ``ALIAS_OF = "qwen2_5"``, the registry
resolves ``qwen2`` to the ``qwen2_5`` family (whose converters and ``from_hf`` loader read the checkpoint's
``config.json``), and the builders here use ``qwen2_5``'s component builders.
"""

from tune.models.qwen2._convert_weights import qwen2_hf_to_tune, qwen2_tune_to_hf
from tune.models.qwen2._model_builders import (
    lora_qwen2_0_5b,
    lora_qwen2_1_5b,
    lora_qwen2_7b,
    qlora_qwen2_0_5b,
    qlora_qwen2_1_5b,
    qlora_qwen2_7b,
    qwen2_0_5b,
    qwen2_1_5b,
    qwen2_7b,
)
from tune.models.qwen2._tokenizer import QWEN2_DEFAULT_SYSTEM_PROMPT, Qwen2Tokenizer, qwen2_tokenizer
from tune.models.qwen2_5 import lora_qwen2, qwen2
from tune.modules import RotaryPositionalEmbeddings

# the family this package's names belong to; read by tune.registry, which registers no family for an alias package
ALIAS_OF = "qwen2_5"


class Qwen2RotaryPositionalEmbeddings(RotaryPositionalEmbeddings):
    """:class:`tune.modules.RotaryPositionalEmbeddings` with Qwen2's RoPE theta as the default (torchtune's class:
    the same rotate-half RoPE, the same values).

    Args:
        dim (int): rotated features per head (the head dimension).
        max_seq_len (int): the largest position + 1 that will be looked up. Default 4096.
        base (float): the RoPE theta. Default 1e6.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 1_000_000.0) -> None:
        super().__init__(dim, max_seq_len=max_seq_len, base=base)


__all__ = [
    "QWEN2_DEFAULT_SYSTEM_PROMPT",
    "Qwen2RotaryPositionalEmbeddings",
    "Qwen2Tokenizer",
    "lora_qwen2",
    "lora_qwen2_0_5b",
    "lora_qwen2_1_5b",
    "lora_qwen2_7b",
    "qlora_qwen2_0_5b",
    "qlora_qwen2_1_5b",
    "qlora_qwen2_7b",
    "qwen2",
    "qwen2_0_5b",
    "qwen2_1_5b",
    "qwen2_7b",
    "qwen2_hf_to_tune",
    "qwen2_tokenizer",
    "qwen2_tune_to_hf",
]
