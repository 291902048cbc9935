"""Llama (all generations) <-> tune weights, and building a model from any Llama ``config.json``.

Hugging Face stores Llama q/k projections in the "rotate half" RoPE layout tune uses, so conversion is a key
rename.
"""

from collections.abc import Mapping
from typing import Any

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf, llama3_rope_kwargs
from tune.modules import TransformerDecoder


def llama_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Llama state dict -> tune keys (``lm_head`` dropped when embeddings are tied)."""
    return convert_hf_to_tune(state_dict, hf_config)


def llama_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Llama keys."""
    return convert_tune_to_hf(state_dict)


def llama_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Llama model (Llama 2, 3, 3.1, 3.2 or 3.3) with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: llama``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for features tune's Llama does not implement (attention or MLP biases, other RoPE scaling).
    """
    for flag in ("attention_bias", "mlp_bias"):
        if hf_config.get(flag, False):
            raise ValueError(f"config.json sets {flag}=true; tune's Llama has no biases in these projections.")
    if hf_config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json has hidden_act={hf_config['hidden_act']!r}; Llama supports only 'silu'.")
    num_heads = hf_config["num_attention_heads"]
    return build_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=hf_config["hidden_size"],
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 2048),
        head_dim=hf_config.get("head_dim"),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
        **llama3_rope_kwargs(hf_config),
    )
