"""Loading a Hugging Face checkpoint without naming a builder (``from_hf``), and back (``to_hf_state_dict``).

These entry points sit above the families: they find the family of a ``config.json`` through ``tune.registry``
and call its builder and converters. Families never import this module (an import-linter contract and
``tests/test_layering.py`` check it); the helpers they share are in ``tune.models._hf``.
"""

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tune import registry
from tune.models._hf import read_hf_config
from tune.modules import RotaryPositionalEmbeddings
from tune.utils import get_logger

log = get_logger(name=__name__)


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
