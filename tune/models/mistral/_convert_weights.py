"""Mistral <-> Hugging Face weights (the Llama layout) and building a model from a Mistral ``config.json``."""

from collections.abc import Mapping
from typing import Any

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf, hf_sliding_windows, require_unscaled_rope
from tune.modules import TransformerDecoder


def mistral_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Mistral state dict -> tune keys."""
    return convert_hf_to_tune(state_dict, hf_config)


def mistral_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Mistral keys."""
    return convert_tune_to_hf(state_dict)


def mistral_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Mistral model with the dimensions of a ``config.json`` (``sliding_window`` on every layer).

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: mistral``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.
    """
    num_heads = hf_config["num_attention_heads"]
    return build_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=hf_config["hidden_size"],
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 32768),
        head_dim=hf_config.get("head_dim"),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_base=require_unscaled_rope(hf_config, "mistral"),
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        sliding_windows=hf_sliding_windows(hf_config, "all"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
