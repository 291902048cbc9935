"""Hugging Face checkpoints: reading ``config.json``, key renaming shared by families, ``from_hf`` and back.

Families own their conversion (``tune/models/<family>/_convert_weights.py``); this module holds the mechanics
they share (rename rules applied to key prefixes, RoPE and sliding-window settings read from either the
transformers 4 or 5 ``config.json`` layout) and the family-agnostic entry points that find a family through
``tune.registry``.
"""

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tune import registry
from tune.modules import RotaryPositionalEmbeddings
from tune.utils import get_logger
from tune.utils._state_dict_keys import invert_rules, rename_keys

log = get_logger(name=__name__)

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


def _safetensors_files(checkpoint_dir: Path) -> list[Path]:
    index = checkpoint_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [checkpoint_dir / name for name in sorted(set(weight_map.values()))]
    single = checkpoint_dir / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"No safetensors weights in {checkpoint_dir} (looked for model.safetensors.index.json, "
            "model.safetensors and *.safetensors). Download them with `tune download <repo_id>`."
        )
    return files


def _config_dtype(hf_config: Mapping[str, Any]) -> torch.dtype:
    name = hf_config.get("dtype") or hf_config.get("torch_dtype")
    if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    return torch.get_default_dtype()


def _is_adapter_key(key: str) -> bool:
    # LoRA/DoRA layers, and the LoRA of stacked experts (`...experts.gate_proj_lora_a`)
    return ".lora_a." in key or ".lora_b." in key or key.endswith((".magnitude", "_lora_a", "_lora_b"))


# The hub's mixture-of-experts checkpoints store one tensor per expert (`model.layers.3.mlp.experts.17.up_proj.weight`)
# where tune stacks a layer's experts into one tensor: such tensors are converted a group at a time (one projection
# of one layer, every expert), not one by one.
_PER_EXPERT_KEY = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")


def expert_group(hf_key: str) -> str | None:
    """The group a per-expert Hugging Face key is converted with (its key with the expert index replaced by
    ``*``), or None for a key of no expert.

    Args:
        hf_key (str): e.g. ``model.layers.3.mlp.experts.17.up_proj.weight``.

    Returns:
        str | None: e.g. ``model.layers.3.mlp.experts.*.up_proj.weight``.
    """
    match = _PER_EXPERT_KEY.match(hf_key)
    return None if match is None else f"{match[1]}.*.{match[3]}"


def from_hf(
    checkpoint_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    **lora_kwargs: Any,
) -> nn.Module:
    """Builds the tune model of a Hugging Face checkpoint directory and loads its weights.

    The family comes from ``config.json``'s ``model_type`` (through ``tune.registry``), the dimensions from the
    rest of ``config.json``. The model is built on the meta device, allocated once on ``device`` and filled
    tensor by tensor from memory-mapped safetensors files, so peak memory is about the model plus one tensor
    (plus, for a mixture-of-experts checkpoint stored one tensor per expert, one projection of one layer's experts:
    those are stacked, so each group is converted at once, see :func:`expert_group`).

    Args:
        checkpoint_dir (str | Path): a directory with ``config.json`` and ``model.safetensors`` (or shards with
            ``model.safetensors.index.json``).
        dtype (torch.dtype | None): parameter dtype; default: the checkpoint's (``config.json`` ``dtype`` or
            ``torch_dtype``), else torch's default dtype.
        device (torch.device | str | None): where to put the model. Default CPU.
        **lora_kwargs: LoRA builder arguments (``lora_attn_modules``, ``apply_lora_to_mlp``,
            ``apply_lora_to_output``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``use_dora``,
            ``quantize_base``). Given any, the LoRA variant is built; its adapters are freshly initialised.

    Returns:
        nn.Module: the model (a ``tune.modules.TransformerDecoder``) in eval mode.

    Raises:
        FileNotFoundError: if ``config.json`` or the weights are missing.
        ValueError: for an unsupported ``model_type`` (listing the supported ones) or weights that do not match.
    """
    checkpoint_dir = Path(checkpoint_dir)
    hf_config = read_hf_config(checkpoint_dir)
    model_type = hf_config.get("model_type")
    if model_type is None:
        raise ValueError(f"{checkpoint_dir / 'config.json'} has no model_type; is it a Hugging Face config?")
    family = registry.family_for_hf_model_type(model_type)
    dtype = dtype or _config_dtype(hf_config)
    device = torch.device(device or "cpu")
    with torch.device("meta"):
        model = family.from_hf_config(hf_config, **lora_kwargs)
    model = model.to(dtype=dtype).to_empty(device=device)
    _load_safetensors(model, checkpoint_dir, family, hf_config, device)
    for module in model.modules():
        if isinstance(module, RotaryPositionalEmbeddings):
            module.reset_parameters()
        elif hasattr(module, "initialize_parameters") and hasattr(module, "adapter_params"):
            module.initialize_parameters()
            if hasattr(module, "initialize_dora_magnitude"):
                module.initialize_dora_magnitude()  # depends on the loaded base weight
    log.info(f"Loaded {model_type!r} checkpoint {checkpoint_dir} with the {family.name} loader ({dtype}, {device}).")
    return model.eval()


def _load_safetensors(
    model: nn.Module, checkpoint_dir: Path, family: registry.ModelFamily, hf_config: Mapping[str, Any], device
) -> None:
    from safetensors import safe_open

    expected = {key for key in model.state_dict() if not _is_adapter_key(key)}
    loaded: set[str] = set()

    def load(tensors: dict[str, torch.Tensor], where: str) -> None:
        converted = family.hf_to_tune(tensors, hf_config)
        result = model.load_state_dict(converted, strict=False)
        if result.unexpected_keys:
            raise ValueError(
                f"{where} has weight(s) {sorted(tensors)[:4]} (tune key(s) {result.unexpected_keys}) that the model "
                "built from config.json does not have; config.json and the weights disagree."
            )
        loaded.update(converted)

    # per-expert tensors wait for the rest of their group (possibly in a later shard); the group is converted
    # once all of config.json's experts are there, so memory holds at most the groups still incomplete
    num_experts = hf_config.get("num_experts", hf_config.get("num_local_experts"))
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for path in _safetensors_files(checkpoint_dir):
        with safe_open(str(path), framework="pt", device="cpu") as shard:
            # one tensor at a time: read from the memory-mapped file, renamed (or split), copied into the model
            for hf_key in shard.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                group = expert_group(hf_key)
                if group is None:
                    load({hf_key: shard.get_tensor(hf_key)}, path.name)
                    continue
                members = pending.setdefault(group, {})
                members[hf_key] = shard.get_tensor(hf_key)
                if isinstance(num_experts, int) and len(members) == num_experts:
                    load(pending.pop(group), path.name)
    for members in pending.values():  # incomplete groups: the family's converter names the missing experts
        load(members, str(checkpoint_dir))
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"The checkpoint in {checkpoint_dir} lacks {len(missing)} weight(s), e.g. {missing[:8]}.")


def to_hf_state_dict(model: nn.Module, hf_config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Converts a tune model's weights to Hugging Face keys, ready for ``safetensors.torch.save_file``.

    Tied embeddings are written once (as ``model.embed_tokens.weight``, without ``lm_head.weight``), as
    ``save_pretrained`` does. LoRA layers are written with their base weights only; merge them first (see
    ``tune.modules.peft``) to export a fine-tuned model.

    Args:
        model (nn.Module): a tune model.
        hf_config (Mapping[str, Any]): the ``config.json`` dict of the checkpoint the model came from.

    Returns:
        dict[str, torch.Tensor]: Hugging Face state dict.

    Raises:
        ValueError: for an unsupported ``model_type``.
    """
    family = registry.family_for_hf_model_type(hf_config["model_type"])
    state_dict = {key: value for key, value in model.state_dict().items() if not _is_adapter_key(key)}
    return family.tune_to_hf(state_dict, hf_config)


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
