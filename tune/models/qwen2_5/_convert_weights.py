"""Qwen2 / Qwen2.5 <-> Hugging Face weights (the Llama layout plus q/k/v biases) and building from ``config.json``."""

from collections.abc import Mapping
from typing import Any

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf, hf_sliding_windows, require_unscaled_rope
from tune.modules import TransformerDecoder


def qwen2_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Qwen2 state dict -> tune keys (``lm_head`` dropped for tied sizes)."""
    return convert_hf_to_tune(state_dict, hf_config)


def qwen2_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Qwen2 keys."""
    return convert_tune_to_hf(state_dict)


def qwen2_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Qwen2 / Qwen2.5 model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: qwen2``).
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
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_base=require_unscaled_rope(hf_config, "qwen2"),
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        q_proj_bias=True,
        k_proj_bias=True,
        v_proj_bias=True,
        sliding_windows=hf_sliding_windows(hf_config, "qwen"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
