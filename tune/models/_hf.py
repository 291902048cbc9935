"""Hugging Face checkpoints, the mechanics families share: ``config.json`` reading and key renaming.

Families own their conversion (``tune/models/<family>/_convert_weights.py``) and build it from these helpers:
rename rules applied to key prefixes, RoPE and sliding-window settings read from either the transformers 4 or 5
``config.json`` layout. Nothing here looks a family up: the entry points that do (``from_hf``,
``to_hf_state_dict``) live in ``tune.models._from_hf``, above the families, and import the registry.
"""

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tune.utils._state_dict_keys import invert_rules, rename_keys

# (Hugging Face key prefix pattern, tune prefix) for the Llama-style layout most families share. Only the module
# path is renamed: the parameter name after it (weight, bias, lora_a.weight, ...) is kept as it is.
LLAMA_STYLE_RULES: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.", "tok_embeddings."),
    (r"model\.norm\.", "norm."),
    (r"lm_head\.", "output."),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.", r"layers.\1.attn.q_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.", r"layers.\1.attn.k_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.", r"layers.\1.attn.v_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.attn.output_proj."),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.", r"layers.\1.attn.q_norm."),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.", r"layers.\1.attn.k_norm."),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.mlp.w1."),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.mlp.w2."),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.mlp.w3."),
    (r"model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.sa_norm."),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.mlp_norm."),
)


def read_hf_config(checkpoint_dir: str | Path) -> dict[str, Any]:
    """Reads ``config.json`` of a Hugging Face checkpoint directory.

    Raises:
        FileNotFoundError: if there is no ``config.json``, naming the command that downloads one.
    """
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"No config.json in {checkpoint_dir}. Point to a Hugging Face model directory, e.g. the output of "
            "`tune download <repo_id> --output-dir <dir>`."
        )
    return json.loads(path.read_text())


def hf_rope_settings(hf_config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE theta and the scaling parameters (None when unscaled) of a config in either transformers layout.

    transformers 4 writes ``rope_theta`` and ``rope_scaling``; transformers 5 writes ``rope_parameters``.
    """
    params = dict(hf_config.get("rope_parameters") or {})
    scaling = dict(hf_config.get("rope_scaling") or {})
    theta = params.get("rope_theta", hf_config.get("rope_theta", 10_000.0))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    merged["rope_type"] = rope_type
    return float(theta), merged


def llama3_rope_kwargs(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_base`` and, for ``rope_type: llama3``, the scaling keyword arguments of ``Llama3ScaledRoPE``.

    Raises:
        ValueError: for a RoPE scaling type tune does not implement.
    """
    theta, scaling = hf_rope_settings(hf_config)
    if scaling is None:
        return {"rope_base": theta}
    if scaling["rope_type"] != "llama3":
        raise ValueError(
            f"RoPE scaling type {scaling['rope_type']!r} in config.json is not supported; supported: default "
            "(no rope_scaling) and llama3."
        )
    return {
        "rope_base": theta,
        "rope_scaling": {
            "scale_factor": float(scaling["factor"]),
            "low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
            "old_context_len": int(scaling.get("original_max_position_embeddings", 8192)),
        },
    }


def require_unscaled_rope(hf_config: Mapping[str, Any], family: str) -> float:
    """The RoPE theta of a family that has no RoPE scaling.

    Raises:
        ValueError: if the config asks for scaling.
    """
    theta, scaling = hf_rope_settings(hf_config)
    if scaling is not None:
        raise ValueError(
            f"{family}: RoPE scaling {scaling['rope_type']!r} in config.json is not supported for this family; "
            "only unscaled RoPE is."
        )
    return theta


def hf_sliding_windows(hf_config: Mapping[str, Any], default_pattern: str = "none") -> list[int | None]:
    """The sliding window of each layer (None for full attention).

    Uses ``layer_types`` when present; otherwise ``default_pattern``: ``"none"`` (no window), ``"all"`` (every
    layer uses ``sliding_window`` when set: Mistral, Phi-3), ``"even"`` (layers 0, 2, 4, ... local: Gemma 2),
    ``"qwen"`` (``use_sliding_window`` from layer ``max_window_layers`` on).
    """
    num_layers = hf_config["num_hidden_layers"]
    window = hf_config.get("sliding_window")
    layer_types = hf_config.get("layer_types")
    if window is None:
        return [None] * num_layers
    if layer_types is not None:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if default_pattern == "all":
        return [window] * num_layers
    if default_pattern == "even":
        return [window if i % 2 == 0 else None for i in range(num_layers)]
    if default_pattern == "qwen" and hf_config.get("use_sliding_window", False):
        start = hf_config.get("max_window_layers", num_layers)
        return [window if i >= start else None for i in range(num_layers)]
    return [None] * num_layers


def convert_hf_to_tune(
    state_dict: Mapping[str, Any],
    hf_config: Mapping[str, Any],
    rules: Iterable[tuple[str, str]] = LLAMA_STYLE_RULES,
    *,
    tie_default: bool = False,
) -> dict[str, Any]:
    """Renames a Hugging Face state dict to tune keys; drops ``lm_head.weight`` when embeddings are tied.

    Args:
        state_dict (Mapping[str, Any]): Hugging Face keys -> tensors.
        hf_config (Mapping[str, Any]): the ``config.json`` dict (``tie_word_embeddings`` is read).
        rules (Iterable[tuple[str, str]]): prefix rename rules, HF -> tune.
        tie_default (bool): the family's ``tie_word_embeddings`` default when ``config.json`` omits it.

    Returns:
        dict[str, Any]: tune keys -> the same tensors.
    """
    if hf_config.get("tie_word_embeddings", tie_default):
        state_dict = {key: value for key, value in state_dict.items() if not key.startswith("lm_head.")}
    return rename_keys(state_dict, rules)


def convert_tune_to_hf(
    state_dict: Mapping[str, Any], rules: Iterable[tuple[str, str]] = LLAMA_STYLE_RULES
) -> dict[str, Any]:
    """Renames a tune state dict to Hugging Face keys (the inverse of ``convert_hf_to_tune``)."""
    return rename_keys(state_dict, invert_rules(rules), source="tune")
