"""Qwen3-MoE <-> Hugging Face weights and building from ``config.json``.

Attention, norms, embeddings and dense layers use the Llama layout (as Qwen3). The experts come in two layouts,
both read: the hub checkpoints' per-expert tensors ``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``
(what ``save_pretrained`` of transformers 5 writes too), and transformers 5's in-memory fused tensors
``mlp.experts.gate_up_proj`` (``[num_experts, 2 * moe_intermediate, hidden]``, gate rows first) and
``mlp.experts.down_proj`` (``[num_experts, hidden, moe_intermediate]``). tune stacks them as ``[num_experts, out,
in]``; writing back gives the per-expert layout. The router ``mlp.gate.weight`` is tune's ``mlp.router.gate``.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from tune.models._common import lora_spec
from tune.models._hf import convert_hf_to_tune, convert_tune_to_hf, hf_sliding_windows, require_unscaled_rope
from tune.models.qwen3_moe._component_builders import _build
from tune.modules import TransformerDecoder

_PER_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.weight$")
_TUNE_EXPERTS = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)$")
_TUNE_ROUTER = re.compile(r"layers\.(\d+)\.mlp\.router\.gate\.(.+)$")


def num_experts(hf_config: Mapping[str, Any]) -> int:
    """Experts per sparse layer: ``num_experts`` (the hub's config.json) or ``num_local_experts`` (what
    transformers 5's ``save_pretrained`` writes)."""
    value = hf_config.get("num_experts", hf_config.get("num_local_experts"))
    if value is None:
        raise ValueError("config.json has neither num_experts nor num_local_experts; is it a Qwen3-MoE config?")
    return int(value)


def qwen3_moe_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Qwen3-MoE state dict (per-expert or fused experts) -> tune keys.

    Raises:
        ValueError: for per-expert tensors of a layer that are not all present (they are stacked, so every
            expert of a layer must be converted in the same call), or keys of no known module.
    """
    converted: dict[str, Any] = {}
    per_expert: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _PER_EXPERT.match(key):
            layer, expert, name = int(match[1]), int(match[2]), match[3]
            per_expert.setdefault((layer, name), {})[expert] = value
        elif match := _FUSED.match(key):
            prefix = f"layers.{match[1]}.mlp.experts."
            if match[2] == "down_proj":
                converted[prefix + "down_proj"] = value
            else:
                gate, up = value.chunk(2, dim=1)  # gate rows first (transformers' Qwen3MoeExperts)
                converted[prefix + "gate_proj"], converted[prefix + "up_proj"] = gate, up
        elif match := _ROUTER.match(key):
            converted[f"layers.{match[1]}.mlp.router.gate.weight"] = value
        else:
            rest[key] = value
    total = num_experts(hf_config)
    for (layer, name), experts in sorted(per_expert.items()):
        missing = sorted(set(range(total)) - set(experts))
        if missing:
            raise ValueError(
                f"Layer {layer}'s {name} has {len(experts)} of its {total} per-expert tensors (missing experts "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}). The experts are stacked into one tensor, so all "
                "of a layer's experts must be converted together (tune.models.from_hf and the checkpointers group "
                "them): the checkpoint lacks these tensors, or they were passed in separate calls."
            )
        converted[f"layers.{layer}.mlp.experts.{name}"] = torch.stack([experts[e] for e in range(total)])
    converted.update(convert_hf_to_tune(rest, hf_config))
    return converted


def qwen3_moe_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Qwen3-MoE keys, experts one tensor each (the hub's and ``save_pretrained``'s
    layout). Experts stored flat (NF4 weights written dense: ``[num_experts * out, in]``) are unflattened.

    Raises:
        ValueError: for LoRA adapters on the experts, which have no place in a model checkpoint (merge them first
            with ``tune.modules.peft.merge_lora_experts``), or unknown keys.
    """
    total = num_experts(hf_config)
    converted: dict[str, Any] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _TUNE_EXPERTS.match(key):
            stacked = value.reshape(total, -1, value.shape[-1])
            for expert in range(total):
                converted[f"model.layers.{match[1]}.mlp.experts.{expert}.{match[2]}.weight"] = stacked[expert]
        elif match := _TUNE_ROUTER.match(key):
            if match[2] != "weight":
                raise ValueError(
                    f"{key!r}: LoRA on the router has no Hugging Face module to be written to (transformers' router "
                    "is not a Linear layer); merge it into layers.N.mlp.router.gate.weight first."
                )
            converted[f"model.layers.{match[1]}.mlp.gate.weight"] = value
        elif "_lora_" in key and ".mlp.experts." in key:
            raise ValueError(
                f"{key!r} is a LoRA adapter of the experts; a Hugging Face checkpoint (and PEFT's format) holds no "
                "expert adapters. Merge them into the expert weights first (tune.modules.peft.get_merged_lora_ckpt or "
                "merge_lora_experts, as the LoRA recipes do); the checkpointers keep the unmerged ones in "
                "adapter/expert_adapter.safetensors."
            )
        else:
            rest[key] = value
    converted.update(convert_tune_to_hf(rest))
    return converted


def qwen3_moe_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Qwen3-MoE model with the dimensions of a ``config.json`` (``model_type: qwen3_moe``).

    Reads ``num_experts`` (or ``num_local_experts``), ``num_experts_per_tok``, ``moe_intermediate_size``,
    ``norm_topk_prob``, ``decoder_sparse_step`` and ``mlp_only_layers``; RoPE theta from ``rope_theta`` or
    ``rope_parameters``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict.
        **lora_kwargs: LoRA builder arguments of :func:`lora_qwen3_moe`; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for attention biases or RoPE scaling (not in Qwen3-MoE), or missing expert settings.
    """
    if hf_config.get("attention_bias", False):
        raise ValueError("config.json sets attention_bias=true; tune's Qwen3-MoE has no attention biases.")
    num_heads = hf_config["num_attention_heads"]
    lora_kwargs = dict(lora_kwargs)
    lora_experts = bool(lora_kwargs.pop("apply_lora_to_experts", False))
    lora_router = bool(lora_kwargs.pop("apply_lora_to_router", False))
    return _build(
        vocab_size=hf_config["vocab_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
        embed_dim=hf_config["hidden_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 32768),
        intermediate_dim=hf_config["intermediate_size"],
        moe_intermediate_dim=hf_config["moe_intermediate_size"],
        num_experts=num_experts(hf_config),
        experts_per_token=hf_config["num_experts_per_tok"],
        norm_topk_prob=hf_config.get("norm_topk_prob", False),  # transformers' default
        decoder_sparse_step=hf_config.get("decoder_sparse_step", 1),
        mlp_only_layers=hf_config.get("mlp_only_layers") or (),
        attn_dropout=hf_config.get("attention_dropout", 0.0),
        head_dim=hf_config.get("head_dim"),
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        rope_base=require_unscaled_rope(hf_config, "qwen3_moe"),
        tie_word_embeddings=hf_config.get("tie_word_embeddings", False),
        sliding_windows=hf_sliding_windows(hf_config, "qwen"),
        use_grouped_mm=False,
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
        lora_experts=lora_experts,
        lora_router=lora_router,
    )
