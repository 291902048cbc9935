"""Qwen2: the released sizes (0.5B, 1.5B, 7B), tokenizer and converters under torchtune's ``qwen2`` names.

Qwen2 and Qwen2.5 are one architecture (Hugging Face ``model_type: qwen2``): this family's builders call the
``qwen2_5`` family's component builders (``tune.models.qwen2_5.qwen2``), and a Hugging Face ``config.json`` with
``model_type: qwen2`` is built by the ``qwen2_5`` family's loader (so this family declares no ``from_hf_config``).
torchtune's checkpointers name both ``QWEN2``: with ``model_type: QWEN2`` a checkpoint converts through this family,
with the same converters as Qwen2.5.
"""

from tune.models import qwen2_5 as _qwen2_5
from tune.models._family import family_builders
from tune.models.qwen2 import _model_builders
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
from tune.registry import ModelFamily, TorchtuneLayout

FAMILY = ModelFamily(
    name="qwen2",
    tokenizer=qwen2_tokenizer,
    builders=family_builders(_model_builders),
    # the registry's converters read config.json (tied embeddings); the torchtune-signature ones above do not
    hf_to_tune=_qwen2_5.qwen2_hf_to_tune,
    tune_to_hf=_qwen2_5.qwen2_tune_to_hf,
    hf_model_types=("qwen2",),
    from_hf_config=None,
    aliases=(),
    tp_plan=_qwen2_5.base_qwen_tp_plan,
    torchtune_layout=TorchtuneLayout(interleaved_rope=False),  # torchtune's Qwen RoPE is rotate_half too
    sizes=_model_builders.MODEL_SIZES,
)


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
