"""Phi-3 <-> Hugging Face weights and building a model from a Phi-3 ``config.json``.

Hugging Face's Phi-3 fuses the attention input projections into ``qkv_proj`` (rows: all query heads, then key
heads, then value heads) and the gate/up projections into ``gate_up_proj`` (rows: gate, then up). tune keeps
them separate (``q_proj``/``k_proj``/``v_proj``, ``w1``/``w3``) so LoRA can target each; conversion splits and
re-fuses along the output dimension.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from tune.models._common import build_decoder, lora_spec
from tune.models._hf import (
    convert_hf_to_tune,
    convert_tune_to_hf,
    hf_sliding_windows,
    require_unscaled_rope,
)
from tune.modules import TransformerDecoder

_QKV = re.compile(r"model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight")
_GATE_UP = re.compile(r"model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight")
_TUNE_SPLIT = re.compile(r"layers\.(\d+)\.(attn\.[qkv]_proj|mlp\.w[13])\.weight")


def _head_sizes(hf_config: Mapping[str, Any]) -> tuple[int, int]:
    num_heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // num_heads
    num_kv_heads = hf_config.get("num_key_value_heads") or num_heads
    return num_heads * head_dim, num_kv_heads * head_dim


def phi3_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Phi-3 state dict -> tune keys, splitting the fused projections.

    Raises:
        ValueError: for keys with no mapping, or a fused key with a suffix other than ``weight``.
    """
    q_dim, kv_dim = _head_sizes(hf_config)
    split, rest = {}, {}
    for key, value in state_dict.items():
        if match := _QKV.fullmatch(key):
            q, k, v = torch.split(value, [q_dim, kv_dim, kv_dim], dim=0)
            layer = match.group(1)
            split.update({f"layers.{layer}.attn.{n}_proj.weight": t for n, t in zip("qkv", (q, k, v), strict=True)})
        elif match := _GATE_UP.fullmatch(key):
            gate, up = value.chunk(2, dim=0)
            split.update({f"layers.{match.group(1)}.mlp.w1.weight": gate, f"layers.{match.group(1)}.mlp.w3.weight": up})
        else:
            rest[key] = value
    return {**convert_hf_to_tune(rest, hf_config), **split}


def phi3_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Phi-3 keys, fusing ``q/k/v_proj`` and ``w1/w3``.

    Raises:
        ValueError: if a layer lacks one of the projections to fuse.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _TUNE_SPLIT.fullmatch(key):
            parts.setdefault(match.group(1), {})[match.group(2)] = value
        else:
            rest[key] = value
    fused = {}
    for layer, tensors in parts.items():
        try:
            qkv = [tensors[f"attn.{n}_proj"] for n in "qkv"]
            gate_up = [tensors["mlp.w1"], tensors["mlp.w3"]]
        except KeyError as missing:
            raise ValueError(f"Layer {layer} lacks {missing} needed to build Phi-3's fused projections.") from None
        fused[f"model.layers.{layer}.self_attn.qkv_proj.weight"] = torch.cat(qkv, dim=0)
        fused[f"model.layers.{layer}.mlp.gate_up_proj.weight"] = torch.cat(gate_up, dim=0)
    return {**convert_tune_to_hf(rest), **fused}


def phi3_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Phi-3 model with the dimensions of a ``config.json``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``model_type: phi3``).
        **lora_kwargs: LoRA builder arguments; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for RoPE scaling (longrope: the 128k variants) or partial rotary embeddings, which tune's
            Phi-3 does not implement.
    """
    rope = dict(hf_config.get("rope_parameters") or {})
    if rope.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json uses partial_rotary_factor != 1 (Phi-4-mini); tune's Phi-3 rotates full heads.")
    num_heads = hf_config["num_attention_heads"]
    return build_decoder(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=hf_config["hidden_size"],
        intermediate_dim=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 4096),
        head_dim=hf_config.get("head_dim"),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        norm_eps=hf_config.get("rms_norm_eps", 1e-5),
        rope_base=require_unscaled_rope(hf_config, "phi3"),
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        sliding_windows=hf_sliding_windows(hf_config, "all"),
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
    )
