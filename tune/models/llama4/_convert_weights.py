"""Llama 4 <-> Hugging Face weights and building the language model from ``config.json``.

Two kinds of checkpoint hold a Llama 4 language model. ``Llama4ForCausalLM`` (``model_type: llama4_text``) names
its weights ``model.layers.N...`` and ``lm_head.weight``. ``Llama4ForConditionalGeneration`` (``model_type:
llama4``; the hub's Scout and Maverick releases) nests the same weights under ``language_model.`` next to a vision
model and a projector, and holds the language model's settings in ``text_config``. tune builds the language model:
reading a multimodal checkpoint drops the vision weights, which the family declares (``LLAMA4_PASSTHROUGH_KEYS``,
its ``ModelFamily.passthrough_hf_keys``) so that ``FullModelHFCheckpointer`` copies them unchanged into every
checkpoint it writes; writing one back puts the language model under ``language_model.`` again.

Per layer: attention and norms use the Llama layout (``self_attn.{q,k,v,o}_proj``, ``input_layernorm``,
``post_attention_layernorm``); the feed-forward block is ``feed_forward.``: ``{gate,up,down}_proj`` in a dense
layer; ``router``, ``shared_expert.{gate,up,down}_proj`` and the fused experts in a sparse one. The experts are
stored as transformers' ``Llama4TextExperts`` holds them, ``x @ W`` style: ``gate_up_proj`` ``[E, dim, 2 * hidden]``
(gate columns first) and ``down_proj`` ``[E, hidden, dim]``; tune's are ``[E, out, in]``, so each is transposed.

Llama 4 applies RoPE to interleaved feature pairs ``(2i, 2i + 1)`` (transformers' ``apply_rotary_emb``, complex
multiplication); tune's RoPE rotates feature ``i`` with ``i + head_dim / 2``. The rows of ``q_proj`` and ``k_proj``
(and of their LoRA ``B`` and DoRA magnitude) are therefore permuted within each head, evens first then odds, on
the way in, and back on the way out. Attention scores are dot products over a head's features, and the q/k norm
has no weight, so the same permutation of queries and keys leaves the model's output unchanged.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from tune.models._common import lora_spec
from tune.models._hf import LLAMA_STYLE_RULES, convert_hf_to_tune, convert_tune_to_hf, llama3_rope_kwargs
from tune.models.llama4._component_builders import _build
from tune.modules import TransformerDecoder

MULTIMODAL_MODEL_TYPE = "llama4"
_PREFIX = "language_model."
# A multimodal checkpoint's weights tune has no module for: dropped on load, copied from the input files on save.
LLAMA4_PASSTHROUGH_KEYS = r"^(model\.)?(vision_model|multi_modal_projector)\."
_NOT_LANGUAGE_MODEL = re.compile(LLAMA4_PASSTHROUGH_KEYS)

# Llama's attention/norm/embedding rules, then Llama 4's feed-forward names (first match wins).
LLAMA4_RULES = (
    *(rule for rule in LLAMA_STYLE_RULES if "mlp" not in rule[0]),
    (r"model\.layers\.(\d+)\.feed_forward\.router\.", r"layers.\1.mlp.router.gate."),
    (r"model\.layers\.(\d+)\.feed_forward\.shared_expert\.gate_proj\.", r"layers.\1.mlp.shared_expert.w1."),
    (r"model\.layers\.(\d+)\.feed_forward\.shared_expert\.down_proj\.", r"layers.\1.mlp.shared_expert.w2."),
    (r"model\.layers\.(\d+)\.feed_forward\.shared_expert\.up_proj\.", r"layers.\1.mlp.shared_expert.w3."),
    (r"model\.layers\.(\d+)\.feed_forward\.gate_proj\.", r"layers.\1.mlp.w1."),
    (r"model\.layers\.(\d+)\.feed_forward\.down_proj\.", r"layers.\1.mlp.w2."),
    (r"model\.layers\.(\d+)\.feed_forward\.up_proj\.", r"layers.\1.mlp.w3."),
)
_HF_EXPERTS = re.compile(r"model\.layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)$")
_TUNE_EXPERTS = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)$")
# q/k tensors whose rows are the projection's outputs (LoRA's A has rank rows and is left alone)
_ROTARY_ROWS = re.compile(r"layers\.\d+\.attn\.(q_proj|k_proj)\.(weight|bias|lora_b\.weight|magnitude)$")

# Llama4TextConfig's defaults (transformers), for the keys a config.json leaves out.
TEXT_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202_048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "moe_layers": None,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layers": None,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_bias": False,
}


def text_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's settings of a ``llama4_text`` or ``llama4`` ``config.json``, defaults filled in."""
    if hf_config.get("model_type") == MULTIMODAL_MODEL_TYPE:
        return {**TEXT_CONFIG_DEFAULTS, **(hf_config.get("text_config") or {})}
    return {**TEXT_CONFIG_DEFAULTS, **hf_config}


def _is_multimodal(hf_config: Mapping[str, Any]) -> bool:
    return hf_config.get("model_type") == MULTIMODAL_MODEL_TYPE


def _permute_rows(value: torch.Tensor, head_dim: int, *, to_tune: bool) -> torch.Tensor:
    """Within each head of ``value``'s rows: interleaved pairs -> evens then odds (to_tune), or back."""
    rows = value.shape[0]
    if rows % head_dim:
        raise ValueError(f"a q/k tensor of {rows} rows is not a whole number of heads of {head_dim} features.")
    rest = value.shape[1:]
    if to_tune:  # row h*d + 2i + j -> h*d + j*d/2 + i
        return value.reshape(rows // head_dim, head_dim // 2, 2, *rest).transpose(1, 2).reshape(value.shape)
    return value.reshape(rows // head_dim, 2, head_dim // 2, *rest).transpose(1, 2).reshape(value.shape)


def _head_dim(config: Mapping[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def llama4_hf_to_tune(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face Llama 4 state dict (text-only or multimodal) -> tune keys.

    Raises:
        ValueError: for a key that maps to nothing (naming it).
    """
    config = text_config(hf_config)
    if _is_multimodal(hf_config):
        text = {}
        for key, value in state_dict.items():
            if _NOT_LANGUAGE_MODEL.match(key):
                continue
            if key.startswith("model." + _PREFIX):  # transformers' module tree (state_dict()), if it nests so
                key = key[len("model.") :]
            if not key.startswith(_PREFIX):
                raise ValueError(f"{key!r} is neither a language-model nor a vision weight of a Llama 4 checkpoint.")
            text[key[len(_PREFIX) :]] = value
        state_dict = text
    converted: dict[str, Any] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _HF_EXPERTS.match(key):
            prefix = f"layers.{match[1]}.mlp.experts."
            if match[2] == "down_proj":  # [E, hidden, dim] -> [E, dim, hidden]
                converted[prefix + "down_proj"] = value.transpose(1, 2).contiguous()
            else:  # [E, dim, 2 * hidden], gate columns first -> two [E, hidden, dim]
                gate, up = value.transpose(1, 2).chunk(2, dim=1)
                converted[prefix + "gate_proj"], converted[prefix + "up_proj"] = gate.contiguous(), up.contiguous()
        else:
            rest[key] = value
    renamed = convert_hf_to_tune(rest, config, LLAMA4_RULES)
    head_dim = _head_dim(config)
    for key, value in renamed.items():
        converted[key] = _permute_rows(value, head_dim, to_tune=True) if _ROTARY_ROWS.match(key) else value
    return converted


def llama4_tune_to_hf(state_dict: Mapping[str, Any], hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """tune state dict -> Hugging Face Llama 4 keys (under ``language_model.`` for a multimodal ``config.json``).
    Experts stored flat (NF4 weights written dense, ``[num_experts * out, in]``) are unflattened.

    Raises:
        ValueError: for LoRA adapters of the experts or the router, which have no Hugging Face module (merge them
            first), or unknown keys.
    """
    config = text_config(hf_config)
    num_experts = int(config["num_local_experts"])
    head_dim = _head_dim(config)
    experts: dict[tuple[str, str], torch.Tensor] = {}
    rest = {}
    for key, value in state_dict.items():
        if match := _TUNE_EXPERTS.match(key):
            experts[(match[1], match[2])] = value.reshape(num_experts, -1, value.shape[-1])
        elif "_lora_" in key and ".mlp.experts." in key:
            raise ValueError(
                f"{key!r} is a LoRA adapter of the experts, which a Hugging Face checkpoint cannot hold. Merge it "
                "first with tune.modules.peft.merge_lora_experts(model), or train without apply_lora_to_experts."
            )
        elif ".mlp.router.gate." in key and not key.endswith(".gate.weight"):
            raise ValueError(
                f"{key!r}: LoRA on the router has no Hugging Face module to be written to (transformers' router is "
                "a plain weight); merge it into layers.N.mlp.router.gate.weight first."
            )
        else:
            rest[key] = _permute_rows(value, head_dim, to_tune=False) if _ROTARY_ROWS.match(key) else value
    converted = convert_tune_to_hf(rest, LLAMA4_RULES)
    for layer in sorted({layer for layer, _ in experts}, key=int):
        prefix = f"model.layers.{layer}.feed_forward.experts."
        parts = {name: experts.get((layer, name)) for name in ("gate_proj", "up_proj", "down_proj")}
        missing = [name for name, value in parts.items() if value is None]
        if missing:
            raise ValueError(f"layers.{layer}.mlp.experts lacks {missing}: all three expert weights are needed.")
        fused = torch.cat((parts["gate_proj"], parts["up_proj"]), dim=1)  # [E, 2 * hidden, dim]
        converted[prefix + "gate_up_proj"] = fused.transpose(1, 2).contiguous()
        converted[prefix + "down_proj"] = parts["down_proj"].transpose(1, 2).contiguous()
    if not _is_multimodal(hf_config):
        return converted
    return {_PREFIX + key: value for key, value in converted.items()}


def llama4_from_hf_config(hf_config: Mapping[str, Any], **lora_kwargs: Any) -> TransformerDecoder:
    """Builds a Llama 4 language model with the dimensions of a ``config.json``.

    Reads ``model_type: llama4_text``, or ``llama4`` with the settings in ``text_config``. ``no_rope_layers`` is
    transformers' per-layer list (1: the layer uses RoPE); empty or absent, every ``no_rope_layer_interval``-th
    layer has none. ``moe_layers`` (sparse layer indices) overrides ``interleave_moe_layer_step``.

    Args:
        hf_config (Mapping[str, Any]): the ``config.json`` dict.
        **lora_kwargs: LoRA builder arguments of :func:`lora_llama4`; given any, LoRA layers are built.

    Returns:
        TransformerDecoder: the model, randomly initialised.

    Raises:
        ValueError: for attention biases, an activation other than SiLU, a RoPE scaling other than llama3, or a
            ``no_rope_layers`` list of the wrong length.
    """
    config = text_config(hf_config)
    if config["attention_bias"]:
        raise ValueError("config.json sets attention_bias=true; tune's Llama 4 has no attention biases.")
    if config["hidden_act"] != "silu":
        raise ValueError(f"config.json sets hidden_act={config['hidden_act']!r}; tune's Llama 4 uses 'silu'.")
    num_layers, num_heads = config["num_hidden_layers"], config["num_attention_heads"]
    rope_flags = config["no_rope_layers"]
    if rope_flags and len(rope_flags) != num_layers:
        raise ValueError(
            f"config.json's no_rope_layers has {len(rope_flags)} entries for {num_layers} layers (one 0/1 flag per "
            "layer, 1 where the layer uses RoPE)."
        )
    lora_kwargs = dict(lora_kwargs)
    lora_experts = bool(lora_kwargs.pop("apply_lora_to_experts", False))
    lora_router = bool(lora_kwargs.pop("apply_lora_to_router", False))
    return _build(
        vocab_size=config["vocab_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=config["num_key_value_heads"] or num_heads,
        embed_dim=config["hidden_size"],
        max_seq_len=config["max_position_embeddings"],
        intermediate_dim=config["intermediate_size_mlp"],
        moe_intermediate_dim=config["intermediate_size"],
        num_experts=config["num_local_experts"],
        experts_per_token=config["num_experts_per_tok"],
        interleave_moe_layer_step=config["interleave_moe_layer_step"],
        moe_layers=config["moe_layers"],
        head_dim=config.get("head_dim"),
        attn_dropout=config["attention_dropout"] or 0.0,
        norm_eps=config["rms_norm_eps"],
        use_qk_norm=bool(config["use_qk_norm"]),
        no_rope_layer_interval=config["no_rope_layer_interval"],
        no_rope_layers=[i for i, uses_rope in enumerate(rope_flags) if not uses_rope] if rope_flags else None,
        attention_chunk_size=config["attention_chunk_size"],
        attn_temperature_tuning=bool(config["attn_temperature_tuning"]),
        floor_scale=config["floor_scale"],
        attn_scale=config["attn_scale"],
        tie_word_embeddings=config["tie_word_embeddings"],
        use_grouped_mm=False,
        lora=lora_spec(**lora_kwargs) if lora_kwargs else None,
        lora_experts=lora_experts,
        lora_router=lora_router,
        **_rope(config),
    )


def _rope(config: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = llama3_rope_kwargs(config)
    scaling = kwargs.get("rope_scaling")
    if scaling is None:
        return {"rope_base": kwargs["rope_base"], "rope_scale_factor": None}
    return {
        "rope_base": kwargs["rope_base"],
        "rope_scale_factor": scaling["scale_factor"],
        "rope_low_freq_factor": scaling["low_freq_factor"],
        "rope_high_freq_factor": scaling["high_freq_factor"],
        "rope_old_context_len": scaling["old_context_len"],
    }


# LoRA on q_proj/k_proj: the B rows (and DoRA magnitudes) follow the permuted weight rows; A is unchanged.
_TUNE_ROTARY_ADAPTER = re.compile(r"layers\.(\d+)\.attn\.(q_proj|k_proj)\.(lora_a\.weight|lora_b\.weight|magnitude)")
_PEFT_ROTARY_ADAPTER = re.compile(
    r"(?:language_model\.)?model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj)\."
    r"(lora_A\.weight|lora_B\.weight|lora_magnitude_vector(?:\.weight)?)"
)
_TO_PEFT = {"lora_a.weight": "lora_A.weight", "lora_b.weight": "lora_B.weight", "magnitude": "lora_magnitude_vector"}


def llama4_adapter_to_peft(
    adapter: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any], lora_alpha: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, int], dict[str, float]]:
    """tune's LoRA/DoRA weights on ``q_proj``/``k_proj`` -> PEFT's, their output rows permuted back to Llama 4's
    interleaved RoPE layout (as :func:`llama4_tune_to_hf` does to the weights); other adapters are left to the
    family's key renaming (the ``AdapterConverter`` protocol of ``tune.registry``).

    Returns:
        tuple: the other adapter weights (tune keys), the PEFT weights made (HF module names, no PEFT prefix), and
        each made module's rank; no alpha differs from ``lora_alpha``.
    """
    head_dim = _head_dim(text_config(hf_config))
    prefix = _PREFIX if _is_multimodal(hf_config) else ""
    rest, peft_state, ranks = {}, {}, {}
    for key, value in adapter.items():
        match = _TUNE_ROTARY_ADAPTER.fullmatch(key)
        if match is None:
            rest[key] = value
            continue
        layer, projection, suffix = match.groups()
        module = f"{prefix}model.layers.{layer}.self_attn.{projection}"
        if suffix != "lora_a.weight":
            value = _permute_rows(value, head_dim, to_tune=False)
        else:
            ranks[module] = value.shape[0]
        peft_state[f"{module}.{_TO_PEFT[suffix]}"] = value
    return rest, peft_state, ranks, {}


def llama4_peft_to_adapter(
    peft_state: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    lora_alpha: float,
    scalings: Mapping[str, float],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """PEFT's LoRA/DoRA weights on ``q_proj``/``k_proj`` -> tune's, rows permuted to tune's RoPE layout and ``B``
    rescaled where PEFT's scaling (``scalings``, ``alpha / r`` per module) is not tune's ``lora_alpha / r``.

    Returns:
        tuple: the other PEFT weights (left to the family's key renaming) and the tune adapter weights made.
    """
    head_dim = _head_dim(text_config(hf_config))
    rest, adapter = {}, {}
    ranks = {}
    for key, value in peft_state.items():
        match = _PEFT_ROTARY_ADAPTER.fullmatch(key)
        if match is not None and match[3] == "lora_A.weight":
            ranks[key[: -len(".lora_A.weight")]] = value.shape[0]
    for key, value in peft_state.items():
        match = _PEFT_ROTARY_ADAPTER.fullmatch(key)
        if match is None:
            rest[key] = value
            continue
        layer, projection, suffix = match.groups()
        tune_key = f"layers.{layer}.attn.{projection}."
        if suffix == "lora_A.weight":
            adapter[tune_key + "lora_a.weight"] = value
            continue
        if suffix == "lora_B.weight":
            module = key[: -len(".lora_B.weight")]
            rank = ranks.get(module, value.shape[1])
            factor = scalings.get(module, lora_alpha / rank) / (lora_alpha / rank)
            adapter[tune_key + "lora_b.weight"] = _permute_rows(
                value * factor if factor != 1 else value, head_dim, to_tune=True
            )
        else:
            adapter[tune_key + "magnitude"] = _permute_rows(value, head_dim, to_tune=True)
    return rest, adapter
