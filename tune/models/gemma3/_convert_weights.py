"""Gemma 3 <-> Hugging Face weights and building a model from a Gemma 3 ``config.json``.

Two kinds of checkpoint hold a Gemma 3 language model. ``Gemma3ForCausalLM`` (``model_type: gemma3_text``; the
270M and 1B releases) names its weights like Gemma 2 plus per-head ``q_norm``/``k_norm``.
``Gemma3ForConditionalGeneration`` (``model_type: gemma3``; the 4B, 12B and 27B releases) nests the same weights
under a prefix, next to a vision tower and a multimodal projector: ``language_model.model.`` in files (the hub's,
and what ``save_pretrained`` writes), ``model.language_model.`` in the module tree of transformers 4.52 and later
(``state_dict()``); its ``config.json`` holds the language model's settings in ``text_config`` (keys left out take
``Gemma3TextConfig``'s defaults).

tune builds the language model only: reading a multimodal checkpoint drops the vision tower and the projector,
and writing one back gives the language model's weights under the files' prefix, ``language_model.model.``. The
family declares the dropped weights (``GEMMA3_PASSTHROUGH_KEYS``, its ``ModelFamily.passthrough_hf_keys``), and
``FullModelHFCheckpointer`` copies them unchanged from the input files into every checkpoint it writes: with the
``config.json`` copied from the input, transformers loads the output as ``Gemma3ForConditionalGeneration`` with
the fine-tuned language model and the original vision tower. LoRA adapters are named after the files' prefix too
(``base_model.model.language_model.model.layers.0.self_attn.q_proj.lora_A.weight``), which PEFT maps onto the
module tree of transformers >= 4.52 when it loads them.
"""

import re
from collections.abc import Mapping
from typing import Any

from tune.models._common import lora_spec
from tune.models._hf import LLAMA_STYLE_RULES, convert_hf_to_tune, convert_tune_to_hf
from tune.models.gemma3._component_builders import _build_gemma3, _sliding_windows
from tune.modules import TransformerDecoder

# Gemma's own norm names first: the first matching rule wins (as in Gemma 2; post_attention_layernorm is the
# post-attention norm here, not Llama's pre-feed-forward one).
GEMMA3_RULES = (
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.sa_scale."),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.", r"layers.\1.mlp_norm."),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.", r"layers.\1.mlp_scale."),
    *(rule for rule in LLAMA_STYLE_RULES if "post_attention_layernorm" not in rule[0]),
)

MULTIMODAL_MODEL_TYPE = "gemma3"
# The language model's prefix in multimodal checkpoint files, and in the module tree of transformers >= 4.52.
_HUB_PREFIX, _NESTED_PREFIX = "language_model.model.", "model.language_model."
# Multimodal weights tune has no module for: the vision tower and the projector into the language model (either
# prefix). Dropped on load, and carried over from the input files on save (the family's passthrough_hf_keys).
GEMMA3_PASSTHROUGH_KEYS = r"^(model\.)?(vision_tower|multi_modal_projector)\."
_NOT_LANGUAGE_MODEL = re.compile(GEMMA3_PASSTHROUGH_KEYS)

# Gemma3TextConfig's defaults (transformers), for the keys a multimodal config.json's text_config leaves out.
TEXT_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}


def text_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's settings of a ``gemma3_text`` or ``gemma3`` ``config.json``, defaults filled in."""
    if hf_config.get("model_type") == MULTIMODAL_MODEL_TYPE:
        return {**TEXT_CONFIG_DEFAULTS, **(hf_config.get("text_config") or {})}
    return {**TEXT_CONFIG_DEFAULTS, **hf_config}


def _is_multimodal(hf_config: Mapping[str, Any]) -> bool:
    return hf_config.get("model_type") == MULTIMODAL_MODEL_TYPE


def gemma3_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Gemma 3 state dict -> tune keys.

    ``lm_head`` is dropped (embeddings are tied); from a multimodal checkpoint the language model's weights are
    kept (either prefix) and the vision tower and projector dropped.

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    if _is_multimodal(hf_config):
        text = {}
        for key, value in state_dict.items():
            if _NOT_LANGUAGE_MODEL.match(key) or key.startswith("language_model.lm_head."):
                continue
            for prefix in (_HUB_PREFIX, _NESTED_PREFIX):
                if key.startswith(prefix):
                    key = "model." + key[len(prefix) :]
                    break
            text[key] = value
        state_dict = text
    return convert_hf_to_tune(state_dict, text_config(hf_config), GEMMA3_RULES, tie_default=True)


def gemma3_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Gemma 3 keys (the language model's, for a multimodal ``config.json``)."""
    converted = convert_tune_to_hf(state_dict, GEMMA3_RULES)
    if not _is_multimodal(hf_config):
        return converted
    return {_HUB_PREFIX + key.removeprefix("model."): value for key, value in converted.items()}


def gemma3_rope_settings(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_base``, ``rope_local_base`` and ``rope_scale_factor`` of a Gemma 3 text config.

    Reads transformers 5's ``rope_parameters`` (one entry per layer type, ``full_attention`` and
    ``sliding_attention``) or the older ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling`` keys.

    Raises:
        ValueError: for a RoPE scaling other than linear, or scaling on the local layers.
    """
    params = dict(hf_config.get("rope_parameters") or {})
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:  # the older layout (a rope_parameters dict without layer types reads as the global layers')
        full = {**dict(hf_config.get("rope_scaling") or {}), **params}
        full.setdefault("rope_theta", hf_config.get("rope_theta", TEXT_CONFIG_DEFAULTS["rope_theta"]))
        local = {"rope_theta": hf_config.get("rope_local_base_freq", TEXT_CONFIG_DEFAULTS["rope_local_base_freq"])}
    full_type = full.get("rope_type", full.get("type", "default"))
    local_type = local.get("rope_type", local.get("type", "default"))
    if full_type not in ("default", "linear") or local_type != "default":
        raise ValueError(
            f"gemma3: RoPE scaling {full_type!r} (global layers) / {local_type!r} (local layers) in config.json is "
            "not supported; supported: 'default' or 'linear' on the global layers and 'default' on the local ones."
        )
    return {
        "rope_base": float(full.get("rope_theta", TEXT_CONFIG_DEFAULTS["rope_theta"])),
        "rope_local_base": float(local.get("rope_theta", TEXT_CONFIG_DEFAULTS["rope_local_base_freq"])),
        "rope_scale_factor": float(full["factor"]) if full_type == "linear" else None,
    }


def gemma3_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Gemma 3 language model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: gemma3_text``, or ``gemma3`` with
            the language model's settings in ``text_config``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for an untied output, an activation other than tanh-approximated GELU, bidirectional
            attention, or unsupported RoPE scaling.
    """
    config = text_config(hf_config)
    if not config["tie_word_embeddings"]:
        raise ValueError("config.json sets tie_word_embeddings=false; tune's Gemma 3 always ties them.")
    activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma 3 activation {activation!r} is not supported; only 'gelu_pytorch_tanh' is.")
    if config.get("use_bidirectional_attention"):
        raise ValueError("config.json sets use_bidirectional_attention=true (an encoder); tune's Gemma 3 is causal.")
    num_layers, window = config["num_hidden_layers"], config["sliding_window"]
    if config.get("layer_types") is not None:
        windows = [window if kind == "sliding_attention" else None for kind in config["layer_types"]]
    else:
        windows = _sliding_windows(num_layers, window, config["sliding_window_pattern"])
    num_heads = config["num_attention_heads"]
    return _build_gemma3(
        vocab_size=config["vocab_size"],
        num_heads=num_heads,
        head_dim=config["head_dim"],
        num_kv_heads=config["num_key_value_heads"] or num_heads,
        embed_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_seq_len=config["max_position_embeddings"],
        sliding_windows=windows,
        attn_dropout=config["attention_dropout"] or 0.0,
        norm_eps=config["rms_norm_eps"],
        query_pre_attn_scalar=config["query_pre_attn_scalar"],
        attn_softcapping=config["attn_logit_softcapping"],
        final_softcapping=config["final_logit_softcapping"],
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
        **gemma3_rope_settings(config),
    )
