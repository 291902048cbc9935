"""Gemma <-> Hugging Face weights and building a model from a Gemma ``config.json``.

Gemma's Hugging Face layout is Llama's (``post_attention_layernorm`` is the pre-feed-forward norm), with no
``lm_head`` where the embeddings are tied (every released size).
"""

from collections.abc import Mapping
from typing import Any

from tune.models._common import lora_spec
from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf, require_unscaled_rope
from tune.models.gemma._component_builders import _gemma_decoder
from tune.modules import TransformerDecoder

# transformers' names of the tanh-approximated GELU; "gelu" is what the first Gemma releases wrote, and transformers
# reads it as the tanh approximation too (GemmaConfig warns and replaces it)
_GELU_TANH_NAMES = ("gelu_pytorch_tanh", "gelu")


def gemma_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Gemma state dict -> tune keys (``lm_head`` dropped: embeddings are tied)."""
    return convert_hf_to_tune(state_dict, hf_config, tie_default=True)


def gemma_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Gemma keys."""
    return convert_tune_to_hf(state_dict)


def gemma_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Gemma model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: gemma``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for an untied output, attention biases, RoPE scaling, or an activation other than
            tanh-approximated GELU.
    """
    if not hf_config.get("tie_word_embeddings", True):
        raise ValueError("config.json sets tie_word_embeddings=false; tune's Gemma always ties them.")
    if hf_config.get("attention_bias", False):
        raise ValueError("config.json sets attention_bias=true; tune's Gemma has no attention biases.")
    activation = hf_config.get("hidden_activation") or hf_config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _GELU_TANH_NAMES:
        raise ValueError(
            f"Gemma activation {activation!r} in config.json is not supported; only {list(_GELU_TANH_NAMES)} "
            "(the tanh-approximated GELU) are."
        )
    return _gemma_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=hf_config["num_attention_heads"],
        head_dim=hf_config.get("head_dim", 256),
        num_kv_heads=hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
        embed_dim=hf_config["hidden_size"],
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 8192),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_base=require_unscaled_rope(hf_config, "gemma"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
