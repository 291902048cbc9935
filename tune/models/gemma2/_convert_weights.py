"""Gemma 2 <-> Hugging Face weights and building a model from a Gemma 2 ``config.json``.

Gemma 2 has four norms per layer. Hugging Face names them input / post-attention / pre-feed-forward /
post-feed-forward; tune's layer calls them ``sa_norm`` / ``sa_scale`` / ``mlp_norm`` / ``mlp_scale``. Note that
``post_attention_layernorm`` means something else here than in Llama (where it is the pre-feed-forward norm).
"""

from collections.abc import Mapping
from typing import Any

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import (
    LLAMA_STYLE_RULES,
    convert_hf_to_tune,
    convert_tune_to_hf,
    hf_sliding_windows,
    require_unscaled_rope,
)
from tune.modules import TransformerDecoder

# Gemma's own norm names first: the first matching rule wins.
GEMMA2_RULES = (
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.sa_scale."),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.", r"layers.\1.mlp_norm."),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.", r"layers.\1.mlp_scale."),
    *(rule for rule in LLAMA_STYLE_RULES if "post_attention_layernorm" not in rule[0]),
)


def gemma2_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Gemma 2 state dict -> tune keys (``lm_head`` dropped: embeddings are tied)."""
    return convert_hf_to_tune(state_dict, hf_config, GEMMA2_RULES, tie_default=True)


def gemma2_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Gemma 2 keys."""
    return convert_tune_to_hf(state_dict, GEMMA2_RULES)


def gemma2_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Gemma 2 model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: gemma2``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for an untied output or an activation other than tanh-approximated GELU.
    """
    if not hf_config.get("tie_word_embeddings", True):
        raise ValueError("config.json sets tie_word_embeddings=false; tune's Gemma 2 always ties them.")
    activation = hf_config.get("hidden_activation") or hf_config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma 2 activation {activation!r} is not supported; only 'gelu_pytorch_tanh' is.")
    num_heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim", 256)
    embed_dim = hf_config["hidden_size"]
    return build_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=embed_dim,
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 8192),
        head_dim=head_dim,
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_base=require_unscaled_rope(hf_config, "gemma2"),
        tie_word_embeddings=True,
        gemma_norms=True,
        activation="gelu_tanh",
        embed_scale=embed_dim**0.5,
        attn_scale=hf_config.get("query_pre_attn_scalar", 256) ** -0.5,
        attn_softcapping=hf_config.get("attn_logit_softcapping", 50.0),
        final_softcapping=hf_config.get("final_logit_softcapping", 30.0),
        sliding_windows=hf_sliding_windows(hf_config, "even"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
