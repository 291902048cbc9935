"""Llama 3.2 Vision weights: Hugging Face ``MllamaForConditionalGeneration`` <-> tune's ``DeepFusionModel``, and the
model built from an Mllama ``config.json``.

Hugging Face keys come in two layouts, both read: the files' (``vision_model.*``, ``multi_modal_projector.*``,
``language_model.model.*``, ``language_model.lm_head.*``) and transformers 5's module tree (``model.vision_model.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head.*``); the files' layout is written. The
language model's layers are one list there, cross-attention layers at ``cross_attention_layers``; in tune each
cross-attention layer is the ``fusion_layer`` of the ``FusionLayer`` holding the self-attention layer after it. The
embedding's last ``num_special_tokens`` rows are tune's ``fusion_embedding``.

Two places where transformers 5.23 computes otherwise than Meta's reference implementation (which tune and
torchtune follow, and which the checkpoints were trained with): the encoder returns the tokens *entering* the layers
in ``intermediate_layers_indices`` (transformers 5.23 returns those leaving them); and a text token whose
cross-attention row is all masked (text before the first image, a row without images) is left unchanged by a
cross-attention layer (transformers 5.23 zeroes only its feed-forward branch).
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from tune.models._hf import llama3_rope_kwargs
from tune.models.llama3_2_vision._component_builders import (
    _lora_fusion_model,
    llama3_2_vision_decoder,
    llama3_2_vision_encoder,
)
from tune.modules.model_fusion import DeepFusionModel
from tune.utils._state_dict_keys import invert_rules, rename_keys

MODEL_TYPE = "mllama"
# MllamaVisionConfig's and MllamaTextConfig's defaults (transformers), for keys a config.json leaves out
VISION_CONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280,
    "hidden_act": "gelu",
    "num_hidden_layers": 32,
    "num_global_layers": 8,
    "attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5120,
    "image_size": 448,
    "patch_size": 14,
    "norm_eps": 1e-5,
    "max_num_tiles": 4,
    "intermediate_layers_indices": [3, 7, 15, 23, 30],
    "supported_aspect_ratios": None,
}
TEXT_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128_256,
    "hidden_size": 4096,
    "hidden_act": "silu",
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14_336,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131_072,
    "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
    "tie_word_embeddings": False,
}
# the embedding rows after the vocabulary (MllamaTextModel: vocab_size + 8)
NUM_SPECIAL_TOKENS = 8

# The vision tower and projector, files' layout -> tune
_VISION_LAYER = r"vision_model\.transformer\.layers\.(\d+)\."
_GLOBAL_LAYER = r"vision_model\.global_transformer\.layers\.(\d+)\."
_CLIP = "encoder.clip."
_TOKEN_POS = r"vision_model\.gated_positional_embedding\."
_ENCODER_LAYER_PARTS = (
    (r"self_attn\.q_proj\.", "attn.q_proj."),
    (r"self_attn\.k_proj\.", "attn.k_proj."),
    (r"self_attn\.v_proj\.", "attn.v_proj."),
    (r"self_attn\.o_proj\.", "attn.output_proj."),
    (r"mlp\.fc1\.", "mlp.w1."),
    (r"mlp\.fc2\.", "mlp.w2."),
    (r"input_layernorm\.", "sa_norm."),
    (r"post_attention_layernorm\.", "mlp_norm."),
)
VISION_RULES: tuple[tuple[str, str], ...] = (
    (r"vision_model\.patch_embedding\.", _CLIP + "conv."),
    (r"vision_model\.class_embedding", _CLIP + "cls_token_embedding"),
    (_TOKEN_POS + r"embedding", _CLIP + "token_pos_embedding.local_token_positional_embedding"),
    (_TOKEN_POS + r"tile_embedding\.", _CLIP + "token_pos_embedding.global_token_positional_embedding."),
    (_TOKEN_POS + r"gate", _CLIP + "token_pos_embedding.gate"),
    (r"vision_model\.pre_tile_positional_embedding\.", _CLIP + "pre_tile_pos_embed."),
    (r"vision_model\.post_tile_positional_embedding\.", _CLIP + "post_tile_pos_embed."),
    (r"vision_model\.layernorm_pre\.", _CLIP + "ln_pre."),
    (r"vision_model\.layernorm_post\.", _CLIP + "ln_post."),
    *((_VISION_LAYER + hf, _CLIP + r"layers.\1." + ours) for hf, ours in _ENCODER_LAYER_PARTS),
    *((_GLOBAL_LAYER + hf, _CLIP + r"global_layers.\1." + ours) for hf, ours in _ENCODER_LAYER_PARTS),
    (_GLOBAL_LAYER + r"gate_attn", _CLIP + r"global_layers.\1.sa_scale.scale"),
    (_GLOBAL_LAYER + r"gate_ffn", _CLIP + r"global_layers.\1.mlp_scale.scale"),
    (r"multi_modal_projector\.", "encoder.projection.output."),
)  # fmt: skip

# Inside one language-model layer: self-attention layers, then cross-attention layers (HF -> tune, relative)
_MLP_PARTS = (
    (r"mlp\.gate_proj\.", "mlp.w1."),
    (r"mlp\.down_proj\.", "mlp.w2."),
    (r"mlp\.up_proj\.", "mlp.w3."),
    (r"post_attention_layernorm\.", "mlp_norm."),
)
SELF_ATTENTION_LAYER_RULES: tuple[tuple[str, str], ...] = (
    (r"self_attn\.q_proj\.", "attn.q_proj."),
    (r"self_attn\.k_proj\.", "attn.k_proj."),
    (r"self_attn\.v_proj\.", "attn.v_proj."),
    (r"self_attn\.o_proj\.", "attn.output_proj."),
    (r"input_layernorm\.", "sa_norm."),
    *_MLP_PARTS,
)
CROSS_ATTENTION_LAYER_RULES: tuple[tuple[str, str], ...] = (
    (r"cross_attn\.q_proj\.", "attn.q_proj."),
    (r"cross_attn\.k_proj\.", "attn.k_proj."),
    (r"cross_attn\.v_proj\.", "attn.v_proj."),
    (r"cross_attn\.o_proj\.", "attn.output_proj."),
    (r"cross_attn\.q_norm\.", "attn.q_norm."),
    (r"cross_attn\.k_norm\.", "attn.k_norm."),
    (r"cross_attn_attn_gate", "ca_scale.scale"),
    (r"cross_attn_mlp_gate", "mlp_scale.scale"),
    (r"input_layernorm\.", "ca_norm."),
    *_MLP_PARTS,
)

# HF prefixes: files' layout, and transformers 5's module tree
_FILE_TEXT, _FILE_HEAD = "language_model.model.", "language_model.lm_head."
_TREE_TEXT, _TREE_HEAD = "model.language_model.", "lm_head."
_TREE_IMAGE = re.compile(r"^model\.(vision_model|multi_modal_projector)\.")
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(.*)$")
_TUNE_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(layer\.|fusion_layer\.)?(.*)$")
_EMBEDDING, _FUSION_EMBEDDING = (
    "decoder.tok_embeddings.embedding.weight",
    "decoder.tok_embeddings.fusion_embedding.weight",
)


def _text_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    return {**TEXT_CONFIG_DEFAULTS, **(hf_config.get("text_config") or {})}


def _vision_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    return {**VISION_CONFIG_DEFAULTS, **(hf_config.get("vision_config") or {})}


def _fusion_interval(text: Mapping[str, Any]) -> int:
    """The tune ``fusion_interval`` of Mllama's ``cross_attention_layers``.

    Raises:
        ValueError: if the cross-attention layers are not one before every ``fusion_interval``-th layer.
    """
    cross = sorted(text["cross_attention_layers"])
    num_self = text["num_hidden_layers"] - len(cross)
    interval = num_self // len(cross) if cross else 0
    # fusion layer k wraps tune layer (k + 1) * interval - 1, which follows k earlier cross-attention layers
    expected = [(k + 1) * interval - 1 + k for k in range(len(cross))]
    if not cross or interval < 1 or cross != expected:
        raise ValueError(
            f"config.json's text_config.cross_attention_layers {cross} (of {text['num_hidden_layers']} layers) is "
            "not one cross-attention layer before every n-th self-attention layer, the layout tune builds "
            "(Llama 3.2 Vision: [3, 8, 13, ...])."
        )
    return interval


def _layer_map(text: Mapping[str, Any]) -> dict[int, tuple[int, bool]]:
    """HF layer index -> (tune layer index, is a cross-attention layer)."""
    cross = set(text["cross_attention_layers"])
    mapping, seen_cross = {}, 0
    for index in range(text["num_hidden_layers"]):
        mapping[index] = (index - seen_cross, index in cross)
        seen_cross += index in cross
    return mapping


# lora_llama3_2_vision's defaults for what trains
_LORA_PARTS = (("decoder", "frozen"), ("encoder", "lora"), ("fusion", "lora"))


def llama3_2_vision_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> DeepFusionModel:
    """Builds Llama 3.2 Vision with the dimensions of an ``MllamaForConditionalGeneration`` ``config.json``.

    Every part is trainable (``requires_grad``); recipes choose what trains. Given LoRA arguments, the LoRA variant
    is built, as :func:`lora_llama3_2_vision` builds it (``decoder_trainable``, ``encoder_trainable``,
    ``fusion_trainable`` default to ``"frozen"``, ``"lora"``, ``"lora"``).

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: mllama``).
        **lora_kwargs: :func:`lora_llama3_2_vision`'s LoRA and trainable-part arguments (``lora_attn_modules``,
            ``lora_rank``, ...).

    Returns:
        DeepFusionModel: the model, randomly initialised.

    Raises:
        ValueError: for another model type, activations or tied embeddings unlike Llama 3.2 Vision's, a RoPE
            scaling tune does not implement, or cross-attention layers tune cannot place.
    """
    if hf_config.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"Llama 3.2 Vision needs a config.json with model_type {MODEL_TYPE!r}, got {hf_config.get('model_type')!r}."
        )
    text, vision = _text_config(hf_config), _vision_config(hf_config)
    if text["hidden_act"] != "silu" or vision["hidden_act"] != "gelu":
        raise ValueError(
            f"config.json's activations (text {text['hidden_act']!r}, vision {vision['hidden_act']!r}) are not "
            "Llama 3.2 Vision's ('silu', 'gelu')."
        )
    if text["tie_word_embeddings"] or hf_config.get("tie_word_embeddings"):
        raise ValueError("config.json ties the word embeddings; Llama 3.2 Vision's are untied.")
    rope = llama3_rope_kwargs(text)
    scaling = rope.get("rope_scaling") or {}
    if scaling and (scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["old_context_len"]) != (
        1.0,
        4.0,
        8192,
    ):
        raise ValueError(f"config.json's llama3 RoPE scaling {scaling} differs from Llama 3.2 Vision's.")
    image_size = vision["image_size"]
    patch_size = vision["patch_size"]
    num_tokens = (image_size // patch_size) ** 2 + 1
    ratios = vision["supported_aspect_ratios"]
    encoder = dict(
        patch_size=patch_size,
        num_heads=vision["attention_heads"],
        clip_embed_dim=vision["hidden_size"],
        clip_num_layers=vision["num_hidden_layers"],
        clip_hidden_states=list(vision["intermediate_layers_indices"]),
        num_layers_projection=vision["num_global_layers"],
        decoder_embed_dim=text["hidden_size"],
        tile_size=image_size,
        max_num_tiles=vision["max_num_tiles"],
        in_channels=vision["num_channels"],
        clip_intermediate_dim=vision["intermediate_size"],
        norm_eps=vision["norm_eps"],
        supported_aspect_ratios=[tuple(r) for r in ratios] if ratios else None,
    )
    decoder = dict(
        vocab_size=text["vocab_size"],
        num_layers=text["num_hidden_layers"] - len(text["cross_attention_layers"]),
        fusion_interval=_fusion_interval(text),
        num_special_tokens=NUM_SPECIAL_TOKENS,
        num_heads=text["num_attention_heads"],
        num_kv_heads=text["num_key_value_heads"],
        embed_dim=text["hidden_size"],
        max_seq_len=text["max_position_embeddings"],
        encoder_max_seq_len=num_tokens * vision["max_num_tiles"],
        rope_base=rope["rope_base"],
        intermediate_dim=text["intermediate_size"],
        norm_eps=text["rms_norm_eps"],
        scale_factor=scaling.get("scale_factor", 1.0),
    )
    if lora_kwargs:
        parts = {part: lora_kwargs.pop(f"{part}_trainable", default) for part, default in _LORA_PARTS}
        return _lora_fusion_model(encoder, decoder, parts, lora_kwargs)
    return DeepFusionModel(
        decoder=llama3_2_vision_decoder(**decoder),
        encoder=llama3_2_vision_encoder(**encoder),
        decoder_trainable=True,
        encoder_trainable=True,
        fusion_trainable=True,
    )


def llama3_2_vision_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``MllamaForConditionalGeneration`` state dict (the files' keys or transformers 5's module tree's) -> the keys
    of tune's ``DeepFusionModel``. LoRA adapter keys (``...q_proj.lora_a.weight``) convert like their layer.

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    text = _text_config(hf_config)
    layers = _layer_map(text)
    image, converted = {}, {}
    for key, value in state_dict.items():
        if _TREE_IMAGE.match(key):
            image[key.removeprefix("model.")] = value
            continue
        for text_prefix in (_FILE_TEXT, _TREE_TEXT):
            if key.startswith(text_prefix):
                converted.update(_text_key_to_tune(key.removeprefix(text_prefix), value, layers, text))
                break
        else:
            if key.startswith((_FILE_HEAD, _TREE_HEAD)):
                rest = key.removeprefix(_FILE_HEAD) if key.startswith(_FILE_HEAD) else key.removeprefix(_TREE_HEAD)
                converted["decoder.output." + rest] = value
            else:
                image[key] = value
    converted.update(rename_keys(image, VISION_RULES))
    return converted


def _text_key_to_tune(
    key: str, value: Any, layers: Mapping[int, tuple[int, bool]], text: Mapping[str, Any]
) -> dict[str, Any]:
    if key == "embed_tokens.weight":
        vocab_size = text["vocab_size"]
        return {_EMBEDDING: value[:vocab_size], _FUSION_EMBEDDING: value[vocab_size:]}
    if key.startswith("norm."):
        return {"decoder." + key: value}
    match = _LAYER_KEY.match(key)
    if match is None or int(match.group(1)) not in layers:
        raise ValueError(f"Hugging Face state-dict key {key!r} of the language model has no known mapping.")
    index, is_cross = layers[int(match.group(1))]
    fusion_layers = {t for t, cross in layers.values() if cross}
    if is_cross:
        prefix, rules = f"decoder.layers.{index}.fusion_layer.", CROSS_ATTENTION_LAYER_RULES
    else:
        inner = "layer." if index in fusion_layers else ""
        prefix, rules = f"decoder.layers.{index}.{inner}", SELF_ATTENTION_LAYER_RULES
    renamed = rename_keys({match.group(2): value}, rules)
    return {prefix + name: tensor for name, tensor in renamed.items()}


def llama3_2_vision_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune's ``DeepFusionModel`` state dict -> ``MllamaForConditionalGeneration`` keys as in its files.

    Raises:
        ValueError: for a key that maps to nothing, or only one of the two embedding tables.
    """
    text = _text_config(hf_config)
    hf_index = {value: key for key, value in _layer_map(text).items()}  # (tune index, is cross) -> HF index
    image, converted = {}, {}
    embeddings = [state_dict.get(_EMBEDDING), state_dict.get(_FUSION_EMBEDDING)]
    if (embeddings[0] is None) != (embeddings[1] is None):
        raise ValueError(
            f"Converting to Hugging Face needs both {_EMBEDDING} and {_FUSION_EMBEDDING} (one embedding there)."
        )
    if embeddings[0] is not None:
        converted[_FILE_TEXT + "embed_tokens.weight"] = torch.cat(embeddings, dim=0)
    for key, value in state_dict.items():
        if key in (_EMBEDDING, _FUSION_EMBEDDING):
            continue
        if key.startswith("encoder."):
            image[key] = value
        elif key.startswith("decoder.norm."):
            converted[_FILE_TEXT + key.removeprefix("decoder.")] = value
        elif key.startswith("decoder.output."):
            converted[_FILE_HEAD + key.removeprefix("decoder.output.")] = value
        else:
            match = _TUNE_LAYER_KEY.match(key)
            if match is None:
                raise ValueError(f"State-dict key {key!r} belongs to no part of Llama 3.2 Vision.")
            is_cross = match.group(2) == "fusion_layer."
            index = hf_index.get((int(match.group(1)), is_cross))
            if index is None:
                raise ValueError(f"State-dict key {key!r} names a layer config.json's text_config does not have.")
            rules = CROSS_ATTENTION_LAYER_RULES if is_cross else SELF_ATTENTION_LAYER_RULES
            renamed = rename_keys({match.group(3): value}, invert_rules(rules), source="tune")
            converted.update({f"{_FILE_TEXT}layers.{index}.{name}": tensor for name, tensor in renamed.items()})
    converted.update(rename_keys(image, invert_rules(VISION_RULES), source="tune"))
    return converted


# tune adapter suffix -> PEFT's
_PEFT_SUFFIXES = {
    "lora_a.weight": "lora_A.weight",
    "lora_b.weight": "lora_B.weight",
    "magnitude": "lora_magnitude_vector",
}
# the files' layout -> transformers 5's module tree (where PEFT looks for the modules of an adapter)
_FILES_TO_TREE = (
    (_FILE_HEAD, _TREE_HEAD),
    (_FILE_TEXT, _TREE_TEXT),
    ("vision_model.", "model.vision_model."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
)


def llama3_2_vision_adapter_to_peft(
    adapter: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any], lora_alpha: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """tune's LoRA (DoRA) adapter weights -> PEFT's, named by transformers' module tree
    (``model.vision_model.transformer.layers.0.self_attn.q_proj``, ``model.language_model.layers.3.cross_attn.q_proj``):
    PEFT loads those names over ``MllamaForConditionalGeneration`` (it does not rename the files' layout of the
    vision tower).

    Returns:
        tuple: no weights left to other converters, the PEFT weights (without ``base_model.model.``), each module's
        rank, and no alpha overrides.
    """
    peft_state, ranks = {}, {}
    for key, value in adapter.items():
        module, suffix = next((key.removesuffix("." + s), s) for s in _PEFT_SUFFIXES if key.endswith("." + s))
        (hf_key,) = llama3_2_vision_tune_to_hf({module + ".weight": value}, hf_config)
        hf_module = hf_key.removesuffix(".weight")
        for files, tree in _FILES_TO_TREE:
            if hf_module.startswith(files):
                hf_module = tree + hf_module.removeprefix(files)
                break
        peft_state[f"{hf_module}.{_PEFT_SUFFIXES[suffix]}"] = value
        if suffix == "lora_a.weight":
            ranks[hf_module] = value.shape[0]
    return {}, peft_state, ranks, {}


def llama3_2_vision_peft_to_adapter(
    peft_state: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    lora_alpha: float,
    scalings: Mapping[str, float],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """PEFT weights in either layout are mapped module by module by :func:`llama3_2_vision_hf_to_tune`: all are
    passed on."""
    return dict(peft_state), {}
