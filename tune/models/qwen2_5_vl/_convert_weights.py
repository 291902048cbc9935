"""Qwen2.5-VL <-> Hugging Face weights, and building the model from a ``config.json``.

Two Hugging Face layouts are read: the released files' (``visual.*``, ``model.*`` for the language model,
``lm_head.*``) and transformers 5's module tree (``model.visual.*``, ``model.language_model.*``, ``lm_head.*``);
the files' layout is written. The vision attention's fused ``qkv`` projection is split into tune's ``q_proj``,
``k_proj`` and ``v_proj`` (rows in that order) and fused back on the way out.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from tune.models._hf import hf_sliding_windows
from tune.models.qwen2_5 import qwen2_hf_to_tune, qwen2_tune_to_hf
from tune.models.qwen2_5_vl._component_builders import IMAGE_TOKEN_ID, _qwen2_5_vl, lora_qwen2_5_vl
from tune.models.qwen2_5_vl._model import Qwen2_5_VisionLanguageModel
from tune.utils import TuneError
from tune.utils._state_dict_keys import invert_rules, rename_keys

MODEL_TYPE = "qwen2_5_vl"
# Qwen2_5_VLVisionConfig's defaults (transformers), for keys a config.json leaves out
VISION_CONFIG_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": [7, 15, 23, 31],
}

# the vision transformer in the files' layout, HF -> tune (qkv is split separately)
_VISION_BLOCK = r"visual\.blocks\.(\d+)\."
VISION_RULES = (
    (r"visual\.patch_embed\.proj\.", "encoder.patch_embed."),
    (_VISION_BLOCK + r"norm1\.", r"encoder.layers.\1.sa_norm."),
    (_VISION_BLOCK + r"norm2\.", r"encoder.layers.\1.mlp_norm."),
    (_VISION_BLOCK + r"attn\.proj\.", r"encoder.layers.\1.attn.output_proj."),
    (_VISION_BLOCK + r"mlp\.gate_proj\.", r"encoder.layers.\1.mlp.w1."),
    (_VISION_BLOCK + r"mlp\.down_proj\.", r"encoder.layers.\1.mlp.w2."),
    (_VISION_BLOCK + r"mlp\.up_proj\.", r"encoder.layers.\1.mlp.w3."),
    (r"visual\.merger\.ln_q\.", "encoder.merger.norm."),
    (r"visual\.merger\.mlp\.0\.", "encoder.merger.fc1."),
    (r"visual\.merger\.mlp\.2\.", "encoder.merger.fc2."),
)
_QKV = re.compile(r"^visual\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
_TUNE_QKV = re.compile(r"^encoder\.layers\.(\d+)\.attn\.([qkv])_proj\.(weight|bias)$")
_ENCODER, _DECODER = "encoder.", "decoder."


def _files_layout(key: str) -> str:
    """A key of transformers 5's module tree in the files' layout (other keys unchanged)."""
    if key.startswith("model.visual."):
        return key.removeprefix("model.")
    if key.startswith("model.language_model."):
        return "model." + key.removeprefix("model.language_model.")
    return key


def qwen2_5_vl_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``Qwen2_5_VLForConditionalGeneration`` state dict (the files' keys or transformers 5's module tree's) -> the
    keys of :class:`Qwen2_5_VisionLanguageModel` (``lm_head`` dropped for tied sizes).

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    vision, text, fused = {}, {}, {}
    for key, value in state_dict.items():
        key = _files_layout(key)
        match = _QKV.match(key)
        if match:
            fused[match.groups()] = value
        elif key.startswith("visual."):
            vision[key] = value
        else:
            text[key] = value
    converted = rename_keys(vision, VISION_RULES)
    for (layer, kind), value in fused.items():
        for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0), strict=True):
            converted[f"encoder.layers.{layer}.attn.{name}.{kind}"] = part
    for key, value in qwen2_hf_to_tune(text, _text_config(hf_config)).items():
        converted[_DECODER + key] = value
    return converted


def qwen2_5_vl_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`Qwen2_5_VisionLanguageModel` state dict -> ``Qwen2_5_VLForConditionalGeneration`` keys as in the
    released files (``visual.*``, ``model.*``, ``lm_head.*``; no ``lm_head`` for tied sizes).

    Raises:
        ValueError: for a key that maps to nothing (naming it), or a vision q/k/v projection without its two
            siblings.
    """
    vision, text, parts = {}, {}, {}
    for key, value in state_dict.items():
        match = _TUNE_QKV.match(key)
        if match:
            layer, which, kind = match.groups()
            parts.setdefault((layer, kind), {})[which] = value
        elif key.startswith(_ENCODER):
            vision[key] = value
        elif key.startswith(_DECODER):
            text[key.removeprefix(_DECODER)] = value
        else:
            raise ValueError(f"State-dict key {key!r} belongs to no part of a Qwen2.5-VL model.")
    converted = rename_keys(vision, invert_rules(VISION_RULES), source="tune")
    for (layer, kind), found in parts.items():
        if set(found) != {"q", "k", "v"}:
            raise ValueError(
                f"Vision layer {layer}'s {kind} has only the {sorted(found)} projection(s); q, k and v are fused "
                "into one Hugging Face qkv and must come together."
            )
        converted[f"visual.blocks.{layer}.attn.qkv.{kind}"] = torch.cat((found["q"], found["k"], found["v"]))
    converted.update(qwen2_tune_to_hf(text, _text_config(hf_config)))
    return converted


def _text_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's keys: a transformers 5 ``text_config`` over the flat keys of the released files."""
    return {**hf_config, **(hf_config.get("text_config") or {})}


def _vision_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    vision = {**VISION_CONFIG_DEFAULTS, **(hf_config.get("vision_config") or {})}
    if "in_chans" in vision and "in_channels" not in (hf_config.get("vision_config") or {}):
        vision["in_channels"] = vision["in_chans"]  # the released files' name
    return vision


def _rope(text: Mapping[str, Any]) -> tuple[float, list[int]]:
    """M-RoPE theta and sections, from ``rope_scaling`` and ``rope_theta`` (the files) or ``rope_parameters``
    (transformers 5)."""
    params = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"Qwen2.5-VL: RoPE type {rope_type!r} in config.json is not supported; only M-RoPE is.")
    theta = params.get("rope_theta", text.get("rope_theta", 1_000_000.0))
    return float(theta), list(params.get("mrope_section", [16, 24, 24]))


def qwen2_5_vl_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> Qwen2_5_VisionLanguageModel:
    """Builds a Qwen2.5-VL model with the dimensions of a ``config.json`` (``model_type: qwen2_5_vl``; the released
    files' flat layout or transformers 5's, with ``text_config``).

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict.
        **lora_kwargs: arguments of :func:`lora_qwen2_5_vl` (LoRA and trainable choices); given any, LoRA layers
            are built.

    Returns:
        Qwen2_5_VisionLanguageModel: the model, randomly initialised.

    Raises:
        ValueError: for a config of another model type, a sliding window, a vision activation other than SiLU or
            RoPE other than M-RoPE.
    """
    if hf_config.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"A Qwen2.5-VL model needs a config.json with model_type {MODEL_TYPE!r}, got "
            f"{hf_config.get('model_type')!r}."
        )
    text, vision = _text_config(hf_config), _vision_config(hf_config)
    if any(window is not None for window in hf_sliding_windows(text, "qwen")):
        raise ValueError("config.json sets use_sliding_window; Qwen2.5-VL in tune has full attention only.")
    if vision["hidden_act"] != "silu":
        raise ValueError(f"Vision activation {vision['hidden_act']!r} is not supported; only 'silu'.")
    theta, sections = _rope(text)
    num_heads = text["num_attention_heads"]
    dims = dict(
        vocab_size=text["vocab_size"],
        num_layers=text["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=text.get("num_key_value_heads") or num_heads,
        embed_dim=text["hidden_size"],
        intermediate_dim=text["intermediate_size"],
        max_seq_len=text.get("max_position_embeddings", 32768),
        attn_dropout=text.get("attention_dropout", 0.0) or 0.0,
        norm_eps=text.get("rms_norm_eps", 1e-6),
        rope_base=theta,
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        mrope_section=sections,
        image_token_id=hf_config.get("image_token_id", IMAGE_TOKEN_ID),
        vision_embed_dim=vision["hidden_size"],
        vision_num_layers=vision["depth"],
        vision_num_heads=vision["num_heads"],
        vision_intermediate_dim=vision["intermediate_size"],
        vision_full_attention_layers=list(vision["fullatt_block_indexes"]),
        vision_window_size=vision["window_size"],
        patch_size=vision["patch_size"],
        temporal_patch_size=vision["temporal_patch_size"],
        spatial_merge_size=vision["spatial_merge_size"],
        in_channels=vision["in_channels"],
        vision_norm_eps=1e-6,  # transformers' vision blocks fix it
        vision_rope_base=float((vision.get("rope_parameters") or {}).get("rope_theta", 10_000.0)),
    )
    if vision["out_hidden_size"] != dims["embed_dim"]:
        raise ValueError(
            f"vision_config.out_hidden_size ({vision['out_hidden_size']}) must equal the language model's "
            f"hidden_size ({dims['embed_dim']})."
        )
    if lora_kwargs:
        return lora_qwen2_5_vl(**lora_kwargs, **dims)
    return _qwen2_5_vl(
        **dims,
        lora=None,
        decoder_lora=None,
        fusion_lora=None,
        decoder_trainable=True,
        encoder_trainable=True,
        fusion_trainable=True,
    )


class _NoPeftFormError(TuneError, ValueError):
    """An adapter PEFT cannot hold (a user's choice of adapted modules): the CLI prints it as one line."""


# tune's adapter parameter suffixes -> PEFT's
_PEFT_SUFFIXES = {
    "lora_a.weight": "lora_A.weight",
    "lora_b.weight": "lora_B.weight",
    "magnitude": "lora_magnitude_vector",
}


def _module_tree(module: str) -> str:
    """A module name of the files' layout in transformers' module tree, where PEFT looks for it."""
    if module.startswith("visual."):
        return "model." + module
    if module.startswith("model."):
        return "model.language_model." + module.removeprefix("model.")
    return module


def qwen2_5_vl_adapter_to_peft(
    adapter: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any], lora_alpha: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """tune's LoRA (DoRA) adapter weights -> PEFT's, named by transformers' module tree
    (``model.language_model.layers.0.self_attn.q_proj``, ``model.visual.merger.mlp.0``), which PEFT loads over
    ``Qwen2_5_VLForConditionalGeneration`` (it does not rename the files' layout).

    transformers fuses the vision tower's q/k/v projections into one ``qkv``. LoRAs of rank ``r`` on some of them
    are exactly one LoRA of rank ``3 r`` on ``qkv``: ``A`` stacks their ``A`` along the rank, ``B`` puts their ``B``
    on the block diagonal (zero blocks for a projection without LoRA), and alpha ``3 * lora_alpha`` keeps each
    block's scaling ``lora_alpha / r``.

    Returns:
        tuple: no weights left to other converters, the PEFT weights (without ``base_model.model.``), each module's
        rank, and the alpha of each fused ``qkv``.

    Raises:
        ValueError: when the q/k/v LoRAs of one vision layer have different ranks, or DoRA covers only some.
    """
    peft_state, ranks, alphas = {}, {}, {}
    fused: dict[str, dict[str, dict[str, torch.Tensor]]] = {}  # vision layer -> projection -> suffix -> weight
    for key, value in adapter.items():
        module, suffix = next((key.removesuffix("." + s), s) for s in _PEFT_SUFFIXES if key.endswith("." + s))
        match = _TUNE_QKV.match(module + ".weight")
        if match is not None:
            fused.setdefault(match.group(1), {}).setdefault(match.group(2), {})[suffix] = value
            continue
        probe = {module + ".weight": torch.empty(0, device="meta")}
        (hf_key,) = qwen2_5_vl_tune_to_hf(probe, hf_config)
        hf_module = _module_tree(hf_key.removesuffix(".weight"))
        peft_state[f"{hf_module}.{_PEFT_SUFFIXES[suffix]}"] = value
        if suffix == "lora_a.weight":
            ranks[hf_module] = value.shape[0]
    for layer, projections in fused.items():
        hf_module = f"model.visual.blocks.{layer}.attn.qkv"
        weights = _fuse_qkv(hf_module, [projections.get(name, {}) for name in "qkv"])
        peft_state.update({f"{hf_module}.{suffix}": value for suffix, value in weights.items()})
        ranks[hf_module] = weights["lora_A.weight"].shape[0]
        alphas[hf_module] = 3 * lora_alpha
    return {}, peft_state, ranks, alphas


def _fuse_qkv(module: str, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One LoRA on a fused q/k/v projection from tune's LoRAs on q, k and v (an empty dict: no LoRA there)."""
    present = [part for part in parts if part]
    ranks = {part["lora_a.weight"].shape[0] for part in present}
    if len(ranks) != 1:
        raise _NoPeftFormError(
            f"Cannot save the adapter of {module} in PEFT's format: its q/k/v LoRAs have ranks "
            f"{sorted(ranks)}, and transformers fuses them into one qkv, whose LoRA needs one rank."
        )
    with_dora = [part for part in present if "magnitude" in part]
    if with_dora and len(with_dora) != len(parts):
        raise _NoPeftFormError(
            f"Cannot save the DoRA adapter of {module} in PEFT's format: DoRA must be on all of q/k/v or none, since "
            "PEFT normalises the fused qkv weight as a whole."
        )
    rank, sample = ranks.pop(), present[0]
    out_dim, in_dim = sample["lora_b.weight"].shape[0], sample["lora_a.weight"].shape[1]
    kwargs = dict(dtype=sample["lora_a.weight"].dtype, device=sample["lora_a.weight"].device)
    lora_a = torch.zeros(3 * rank, in_dim, **kwargs)
    lora_b = torch.zeros(3 * out_dim, 3 * rank, **kwargs)
    for index, part in enumerate(parts):
        if part:  # [r, in] rows of A; a [out, r] block of B on the diagonal
            lora_a[index * rank : (index + 1) * rank] = part["lora_a.weight"]
            lora_b[index * out_dim : (index + 1) * out_dim, index * rank : (index + 1) * rank] = part["lora_b.weight"]
    weights = {"lora_A.weight": lora_a, "lora_B.weight": lora_b}
    if with_dora:
        weights["lora_magnitude_vector"] = torch.cat([part["magnitude"] for part in parts])
    return weights


def qwen2_5_vl_peft_to_adapter(
    peft_state: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    lora_alpha: float,
    scalings: Mapping[str, float],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """PEFT weights are mapped module by module by :func:`qwen2_5_vl_hf_to_tune` (both layouts): passed on, but
    for an adapter on the fused vision ``qkv``, which tune cannot split.

    Raises:
        ValueError: for an adapter on a vision ``qkv`` projection.
    """
    for key in peft_state:
        if _QKV.match(_files_layout(key.split(".lora_", 1)[0]) + ".weight"):
            raise ValueError(
                f"Cannot load the PEFT adapter of {key.split('.lora_', 1)[0]}: a LoRA on the vision tower's fused "
                "qkv projection has no exact split into tune's q_proj/k_proj/v_proj adapters."
            )
    return dict(peft_state), {}
