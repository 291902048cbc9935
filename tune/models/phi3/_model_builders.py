"""Phi-3 model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`phi3`) and the Hugging Face repo whose
``config.json`` they are; the builders read it. A ``lora_*`` builder is the size's builder with fresh adapters (made
by ``lora_size_builder`` from the family's LoRA component builder); a ``qlora_*`` builder is the ``lora_*`` one with
``quantize_base=True``.

The 128k-context size uses LongRoPE. Its 48 + 48 published per-frequency factors are not in the table (tune does
not ship a transcription of them): its builders read them from the checkpoint's ``config.json``
(``hf_config_path``); without it they build LongRoPE with every factor 1.0 (no frequency rescaling, the attention
factor of a 131072 / 4096 extension still applied) and log a warning. ``tune.models.from_hf`` always reads them.
"""

import logging
from typing import Any

from tune.models._common import ModelSize, lora_size_builder, qlora_builder
from tune.models.phi3._component_builders import lora_phi3, phi3
from tune.models.phi3._convert_weights import read_long_rope_factors as _read_long_rope_factors
from tune.modules import TransformerDecoder

log = logging.getLogger(__name__)

# One size per row (kept as written: the formatter would give every argument a line of its own).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "phi3_mini": ModelSize("microsoft/Phi-3-mini-4k-instruct", dict(
        vocab_size=32064, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072, intermediate_dim=8192,
        max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0, sliding_window=2047)),
    "phi3_mini_128k": ModelSize("microsoft/Phi-3-mini-128k-instruct", dict(
        vocab_size=32064, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072, intermediate_dim=8192,
        max_seq_len=131072, norm_eps=1e-5, rope_base=10_000.0, rope_scaling=dict(original_max_seq_len=4096))),
}
# fmt: on


def phi3_mini() -> TransformerDecoder:
    """Phi-3-mini-4k, randomly initialised (load weights with a checkpointer or ``tune.models.from_hf``)."""
    return phi3(**MODEL_SIZES["phi3_mini"].dims)


lora_phi3_mini = lora_size_builder(phi3_mini, lora_phi3, MODEL_SIZES)
qlora_phi3_mini = qlora_builder(lora_phi3_mini)


def _mini_128k_dims(hf_config_path: str | None) -> dict[str, Any]:
    dims = dict(MODEL_SIZES["phi3_mini_128k"].dims)
    if hf_config_path is None:
        log.warning(
            "phi3_mini_128k built without hf_config_path: LongRoPE's per-frequency factors are all 1.0, not the "
            "published ones; pass the checkpoint's config.json (model.hf_config_path) to fine-tune the real model."
        )
        return dims
    dims["rope_scaling"] = {**dims["rope_scaling"], **_read_long_rope_factors(hf_config_path)}
    return dims


def phi3_mini_128k(hf_config_path: str | None = None) -> TransformerDecoder:
    """Phi-3-mini-128k (LongRoPE, 131072 positions), randomly initialised.

    Args:
        hf_config_path (str | None): the checkpoint's ``config.json`` (or its directory), whose longrope
            ``short_factor``/``long_factor`` the model uses. Default None: every factor 1.0 (see the module
            docstring), with a warning.

    Raises:
        FileNotFoundError: if ``hf_config_path`` has no config.json.
        ValueError: if that config.json has no longrope scaling.
    """
    return phi3(**_mini_128k_dims(hf_config_path))


lora_phi3_mini_128k = lora_size_builder(phi3_mini_128k, lora_phi3, dims=_mini_128k_dims)
qlora_phi3_mini_128k = qlora_builder(lora_phi3_mini_128k)
