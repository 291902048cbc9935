"""Gemma 3 with images <-> Hugging Face ``Gemma3ForConditionalGeneration`` weights, and building the model from its
``config.json`` (``model_type: gemma3``).

The files name the vision tower ``vision_tower.vision_model.*``, the projector ``multi_modal_projector.*`` and the
language model ``language_model.model.*``; transformers 4.52 and later name them ``model.vision_tower.*`` (5: without
``vision_model.``), ``model.multi_modal_projector.*`` and ``model.language_model.*`` in the module tree. Both are
read; the files' layout is written. The language model's keys go through the ``gemma3`` family's converters.
"""

import re
from collections.abc import Mapping
from typing import Any

from tune.models.gemma3 import gemma3_from_hf_config, gemma3_hf_to_tune, gemma3_tune_to_hf
from tune.models.gemma3_vision._component_builders import (
    IMAGE_TOKEN_ID,
    _assemble,
    _check_trainable_choices,
    _lora_vision_linear,
    _set_trainable,
)
from tune.models.gemma3_vision._model import Gemma3VisionLanguageModel
from tune.modules.vision import siglip_vision_encoder
from tune.utils._state_dict_keys import invert_rules, rename_keys

MULTIMODAL_MODEL_TYPE = "gemma3"

# Gemma3Config's defaults (transformers) for the vision tower: the SigLIP of the 4B, 12B and 27B releases
VISION_CONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 896,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}

# The vision tower and projector in the files' layout (a module tree's keys are put in it first), HF -> tune.
_VISION_LAYER = r"vision_tower\.vision_model\.encoder\.layers\.(\d+)\."
GEMMA3_VISION_RULES = (
    (r"vision_tower\.vision_model\.embeddings\.patch_embedding\.", "encoder.patch_embedding."),
    (r"vision_tower\.vision_model\.embeddings\.position_embedding\.", "encoder.position_embedding."),
    (_VISION_LAYER + r"self_attn\.q_proj\.", r"encoder.layers.\1.attn.q_proj."),
    (_VISION_LAYER + r"self_attn\.k_proj\.", r"encoder.layers.\1.attn.k_proj."),
    (_VISION_LAYER + r"self_attn\.v_proj\.", r"encoder.layers.\1.attn.v_proj."),
    (_VISION_LAYER + r"self_attn\.out_proj\.", r"encoder.layers.\1.attn.output_proj."),
    (_VISION_LAYER + r"layer_norm1\.", r"encoder.layers.\1.sa_norm."),
    (_VISION_LAYER + r"layer_norm2\.", r"encoder.layers.\1.mlp_norm."),
    (_VISION_LAYER + r"mlp\.", r"encoder.layers.\1.mlp."),
    (r"vision_tower\.vision_model\.post_layernorm\.", "encoder.norm."),
    (r"multi_modal_projector\.mm_soft_emb_norm\.", "projector.norm."),
    (r"multi_modal_projector\.mm_input_projection_weight", "projector.projection"),
)
# SigLIP's prefix in the files, and in transformers 5's module tree (which drops "vision_model.")
_FILE_TOWER, _TREE_TOWER = "vision_tower.vision_model.", "vision_tower."
_IMAGE_PATH = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")
_TUNE_IMAGE_PATH = re.compile(r"^(encoder|projector)\.")
_DECODER = "decoder."


def gemma3_vision_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``Gemma3ForConditionalGeneration`` state dict (the files' keys or transformers' module tree's) -> the keys of
    :class:`Gemma3VisionLanguageModel`.

    Args:
        state_dict (Mapping[str, Any]): Hugging Face weights (any subset).
        hf_config (Mapping[str, Any]): the ``config.json`` dict.

    Returns:
        dict[str, Any]: the weights under tune's keys (``encoder.*``, ``projector.*``, ``decoder.*``).

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    image, text = {}, {}
    for key, value in state_dict.items():
        if _IMAGE_PATH.match(key):
            key = key.removeprefix("model.")
            if key.startswith(_TREE_TOWER) and not key.startswith(_FILE_TOWER):  # transformers 5's module tree
                key = _FILE_TOWER + key.removeprefix(_TREE_TOWER)
            image[key] = value
        else:
            text[key] = value
    converted = rename_keys(image, GEMMA3_VISION_RULES)
    for key, value in gemma3_hf_to_tune(text, _multimodal(hf_config)).items():
        converted[_DECODER + key] = value
    return converted


def gemma3_vision_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`Gemma3VisionLanguageModel` state dict -> ``Gemma3ForConditionalGeneration`` keys as in its files
    (``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``; no ``lm_head``,
    which is tied).

    Args:
        state_dict (Mapping[str, Any]): tune weights (any subset).
        hf_config (Mapping[str, Any]): the ``config.json`` dict.

    Returns:
        dict[str, Any]: the weights under the files' keys.

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    image, text = {}, {}
    for key, value in state_dict.items():
        if _TUNE_IMAGE_PATH.match(key):
            image[key] = value
        elif key.startswith(_DECODER):
            text[key.removeprefix(_DECODER)] = value
        else:
            raise ValueError(f"State-dict key {key!r} belongs to no part of a Gemma 3 vision-language model.")
    converted = rename_keys(image, invert_rules(GEMMA3_VISION_RULES), source="tune")
    converted.update(gemma3_tune_to_hf(text, _multimodal(hf_config)))
    return converted


def _multimodal(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    # the language model's converters read its settings from text_config when the type is the multimodal one
    return {**hf_config, "model_type": MULTIMODAL_MODEL_TYPE}


def gemma3_vision_from_hf_config(hf_config: Mapping[str, Any], **kwargs: Any) -> Gemma3VisionLanguageModel:
    """Builds Gemma 3 with images with the dimensions of a ``Gemma3ForConditionalGeneration`` ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: gemma3``).
        **kwargs: ``decoder_trainable``, ``encoder_trainable``, ``fusion_trainable`` (as in
            :func:`gemma3_vision` without LoRA arguments, as in :func:`lora_gemma3_vision` with them) and the
            LoRA builder arguments (``lora_attn_modules``, ``lora_rank``, ...); given any LoRA argument, LoRA
            layers are built.

    Returns:
        Gemma3VisionLanguageModel: the model, randomly initialised.

    Raises:
        ValueError: for a config of another model type, a vision tower unlike Gemma 3's (a pooling head, an
            activation other than tanh-GELU), bad trainable choices, and as ``gemma3_from_hf_config`` for the
            language model.
    """
    if hf_config.get("model_type") != MULTIMODAL_MODEL_TYPE:
        raise ValueError(
            f"Gemma 3 with images needs a config.json with model_type {MULTIMODAL_MODEL_TYPE!r} "
            f"(Gemma3ForConditionalGeneration), got {hf_config.get('model_type')!r}."
        )
    trainable = {name: kwargs.pop(name) for name in ("decoder_trainable", "encoder_trainable", "fusion_trainable")
                 if name in kwargs}  # fmt: skip
    lora_kwargs = kwargs
    vision = {**VISION_CONFIG_DEFAULTS, **(hf_config.get("vision_config") or {})}
    if vision["vision_use_head"]:
        raise ValueError("config.json's vision_config sets vision_use_head=true; Gemma 3's SigLIP has no head.")
    if vision["hidden_act"] != "gelu_pytorch_tanh":
        raise ValueError(f"SigLIP activation {vision['hidden_act']!r} is not supported; only 'gelu_pytorch_tanh'.")
    if lora_kwargs:
        choices = {"decoder_trainable": "lora", "encoder_trainable": "frozen", "fusion_trainable": "frozen"}
        choices.update(trainable)
        decoder_choice, encoder_choice, fusion_choice = _check_trainable_choices(
            choices["decoder_trainable"], choices["encoder_trainable"], choices["fusion_trainable"]
        )
    else:
        choices = {"decoder_trainable": True, "encoder_trainable": False, "fusion_trainable": True, **trainable}
        decoder_choice, encoder_choice, fusion_choice = (
            "full" if choices[name] else "frozen"
            for name in ("decoder_trainable", "encoder_trainable", "fusion_trainable")
        )
    decoder_lora = dict(lora_kwargs) if decoder_choice == "lora" else {}
    encoder = siglip_vision_encoder(
        image_size=vision["image_size"],
        patch_size=vision["patch_size"],
        embed_dim=vision["hidden_size"],
        num_layers=vision["num_hidden_layers"],
        num_heads=vision["num_attention_heads"],
        intermediate_dim=vision["intermediate_size"],
        norm_eps=vision["layer_norm_eps"],
        attn_dropout=vision["attention_dropout"] or 0.0,
        in_channels=vision["num_channels"],
        linear=_lora_vision_linear(**lora_kwargs) if encoder_choice == "lora" else None,
    )
    decoder = gemma3_from_hf_config(_multimodal(hf_config), **decoder_lora)
    image_token_id = hf_config.get("image_token_id", hf_config.get("image_token_index", IMAGE_TOKEN_ID))
    model = _assemble(
        encoder, decoder, hf_config.get("mm_tokens_per_image", 256), image_token_id, vision["layer_norm_eps"]
    )
    _set_trainable(model, decoder_choice, encoder_choice, fusion_choice)
    return model
