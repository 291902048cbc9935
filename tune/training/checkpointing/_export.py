"""One model for an inference stack, from a run's checkpoint: a merged Hugging Face checkpoint (:func:`export_hf`).

A run's ``step_N`` directory holds the merged model (full fine-tuning, or LoRA without
``save_adapter_weights_only``) or only the PEFT adapter; :class:`ExportSource` reads either as one Hugging Face
state dict, merging the adapter into the base weights on the fly, file by file. The GGUF writer
(``tune.training.checkpointing._gguf``) reads its weights through the same class.
"""

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tune.training.checkpointing import _constants as keys
from tune.training.checkpointing._formats import peft_scaling
from tune.training.checkpointing._io import (
    PICKLE_SUFFIXES,
    SAFETENSORS_SUFFIX,
    CheckpointError,
    describe_dir,
    fsync_dir,
    load_safetensors,
    load_weights_file,
    read_json,
    save_json,
    save_safetensors,
)
from tune.training.checkpointing._layout import list_complete_checkpoints, read_marker

# --dtype of `tune export --format hf`
HF_EXPORT_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# what a run writes into step_N that is no part of the model
_RUN_FILES = {keys.RECIPE_STATE_FILE, keys.CONFIG_FILE, keys.COMPLETE_MARKER, keys.DOWNLOAD_RECORD_FILE}
_INDEX_FILES = (keys.SAFETENSORS_INDEX_FILE, keys.BIN_INDEX_FILE)
_PEFT_PREFIX = "base_model.model."


def resolve_checkpoint(path: str | Path) -> Path:
    """The model directory that ``path`` names: a run's ``output_dir`` (its newest complete checkpoint), a
    ``step_N``/``epoch_N`` directory, or any Hugging Face model directory.

    Args:
        path (str | Path): the directory.

    Returns:
        Path: the checkpoint directory to export.

    Raises:
        CheckpointError: when ``path`` is no directory, or a run's directory without a complete checkpoint.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory: pass a run's output_dir or one of its step_N directories")
    if (path / "config.json").is_file() or (path / keys.ADAPTER_SUBDIR).is_dir() or read_marker(path) is not None:
        return path
    complete = list_complete_checkpoints(path)
    if complete:
        return complete[-1][0]
    raise CheckpointError(
        f"{path} holds no model and no complete checkpoint (step_N/ with a .complete marker); "
        f"it contains: {describe_dir(path)}"
    )


@dataclass
class ExportSource:
    """A Hugging Face causal LM to export, read file by file: the merged model of a checkpoint, or its base model
    with the PEFT adapter merged in.

    Attributes:
        checkpoint_dir (Path): the directory exported (``config.json``, tokenizer and generation files).
        weight_files (list[Path]): the model's weight files (the base model's when the adapter is merged here).
        hf_config (dict): ``config.json``.
        adapter_dir (Path | None): the PEFT adapter merged on read (a ``save_adapter_weights_only`` checkpoint).
        base_dir (Path | None): the base model of that adapter.
    """

    checkpoint_dir: Path
    weight_files: list[Path]
    hf_config: dict[str, Any]
    adapter_dir: Path | None = None
    base_dir: Path | None = None

    def file_dirs(self) -> list[Path]:
        """Where the non-weight files come from, first match wins: the checkpoint, then the base model."""
        return [self.checkpoint_dir] + ([self.base_dir] if self.base_dir is not None else [])

    def find_file(self, name: str) -> Path | None:
        """A file of the model (``tokenizer.json``, ...) in the checkpoint or, failing that, the base model."""
        for directory in self.file_dirs():
            if (directory / name).is_file():
                return directory / name
        return None

    def files(self) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
        """Each weight file with its tensors (memory-mapped; the adapter's modules merged in float32 and cast back)."""
        adapter = _PeftAdapter(self.adapter_dir) if self.adapter_dir is not None else None
        for path in self.weight_files:
            state = load_weights_file(path)
            if adapter is not None:
                state = {key: adapter.merge(key, value) for key, value in state.items()}
            yield path, state
        if adapter is not None:
            adapter.check_all_merged()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor of the model, merged."""
        return {key: value for _, state in self.files() for key, value in state.items()}


def open_checkpoint(checkpoint: str | Path, base_dir: str | Path | None = None) -> ExportSource:
    """Reads what a checkpoint holds, for export.

    Args:
        checkpoint (str | Path): a run's ``output_dir``, a ``step_N`` directory, or a Hugging Face model directory.
        base_dir (str | Path | None): the base model of an adapter-only checkpoint; default: the one its
            ``adapter_config.json`` names when that is a local directory, else the run's
            ``checkpointer.checkpoint_dir`` (from ``config.yaml``).

    Returns:
        ExportSource: the model to export.

    Raises:
        CheckpointError: for a checkpoint in Meta's or tune's own format, a missing base model, or an adapter that
            cannot be merged exactly (rsLoRA, modules other than linear layers).
    """
    checkpoint_dir = resolve_checkpoint(checkpoint)
    marker = read_marker(checkpoint_dir) or {}
    if marker.get("format") not in (None, "hf"):
        raise CheckpointError(
            f"{checkpoint_dir} holds a {marker['format']!r}-format checkpoint; tune export reads the Hugging Face "
            "checkpoints that runs with checkpointer._component_=tune.training.FullModelHFCheckpointer write"
        )
    weight_files = _weight_files(checkpoint_dir)
    if weight_files:
        return ExportSource(checkpoint_dir, weight_files, _hf_config(checkpoint_dir))
    adapter_dir = checkpoint_dir / keys.ADAPTER_SUBDIR
    if not (adapter_dir / keys.ADAPTER_CONFIG_FILE).is_file():
        raise CheckpointError(
            f"{checkpoint_dir} holds no model weights (model.safetensors or shards) and no adapter/; "
            f"it contains: {describe_dir(checkpoint_dir)}"
        )
    base = Path(base_dir).expanduser() if base_dir is not None else _base_model_dir(checkpoint_dir, adapter_dir)
    base_files = _weight_files(base)
    if not base_files:
        raise CheckpointError(
            f"the base model {base} of the adapter in {adapter_dir} holds no weights; pass the directory of the "
            "model the run fine-tuned with --base DIR"
        )
    config_dir = checkpoint_dir if (checkpoint_dir / "config.json").is_file() else base
    return ExportSource(checkpoint_dir, base_files, _hf_config(config_dir), adapter_dir, base)


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    base_dir: str | Path | None = None,
) -> Path:
    """Writes a checkpoint as one Hugging Face model directory: the merged weights (an adapter-only checkpoint's
    adapter merged into its base model) in the input's files, ``config.json``, tokenizer, generation config and
    chat template. Loads with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and no LoRA code.

    Args:
        checkpoint (str | Path): a run's ``output_dir`` (its newest checkpoint), a ``step_N`` directory, or a
            Hugging Face model directory.
        out_dir (str | Path): the directory to create (must not exist, or be empty); written to a temporary
            directory beside it and renamed, so it never holds half a model.
        dtype (str | None): ``"f32"``, ``"f16"`` or ``"bf16"`` to cast every floating-point weight, None to keep
            each weight's dtype. Default None.
        base_dir (str | Path | None): see :func:`open_checkpoint`.

    Returns:
        Path: ``out_dir``.

    Raises:
        CheckpointError: see :func:`open_checkpoint`; or for an unknown ``dtype`` or an ``out_dir`` that holds files.
    """
    if dtype is not None and dtype not in HF_EXPORT_DTYPES:
        raise CheckpointError(
            f"--dtype {dtype} is not a Hugging Face dtype; choose one of {', '.join(HF_EXPORT_DTYPES)}"
        )
    source = open_checkpoint(checkpoint, base_dir)
    out_dir = Path(out_dir).expanduser()
    _check_free(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    cast = HF_EXPORT_DTYPES[dtype] if dtype else None
    temp = out_dir.parent / f".{out_dir.name}.partial"  # a crashed export's leftover is replaced
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        weight_map = {}
        for path, state in source.files():
            name = _output_name(path, single=len(source.weight_files) == 1)
            if source.adapter_dir is None and cast is None and path.suffix == SAFETENSORS_SUFFIX:
                shutil.copy2(path, temp / name)  # nothing changes: the run's own file, byte for byte
            else:
                if cast is not None:
                    state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
                save_safetensors(state, temp / name)
            weight_map.update(dict.fromkeys(state, name))
        if len(source.weight_files) > 1:
            index = {"metadata": {"total_size": _total_size(temp, weight_map)}, "weight_map": weight_map}
            save_json(index, temp / keys.SAFETENSORS_INDEX_FILE)
        _copy_model_files(source, temp, dtype_name=str(cast).removeprefix("torch.") if cast else None)
        fsync_dir(temp)
        if out_dir.exists():
            out_dir.rmdir()  # empty: checked above
        os.replace(temp, out_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return out_dir


def missing_inference_files(directory: str | Path) -> list[str]:
    """What an inference stack looks for that ``directory`` lacks: a tokenizer, a chat template, a generation config.

    Args:
        directory (str | Path): a Hugging Face model directory.

    Returns:
        list[str]: descriptions of the missing parts (empty when complete).
    """
    directory = Path(directory)
    missing = []
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    if read_chat_template(directory) is None:
        missing.append("chat template (tokenizer_config.json chat_template or chat_template.jinja)")
    if not (directory / "generation_config.json").is_file():
        missing.append("generation_config.json")
    return missing


def read_chat_template(directory: str | Path) -> str | None:
    """The chat template of a Hugging Face model directory: ``chat_template.jinja``, or ``tokenizer_config.json``'s
    ``chat_template`` (the ``default`` one where it lists several), or None."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    if (directory / "tokenizer_config.json").is_file():
        template = read_json(directory / "tokenizer_config.json", "tokenizer config").get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template
    return None


class _PeftAdapter:
    """A PEFT LoRA/DoRA adapter (``adapter_model.safetensors`` + ``adapter_config.json``), merged key by key."""

    def __init__(self, adapter_dir: Path) -> None:
        self.config = read_json(adapter_dir / keys.ADAPTER_CONFIG_FILE, "adapter config")
        if self.config.get("use_rslora"):
            raise CheckpointError(f"{adapter_dir}: rsLoRA adapters (use_rslora: true) are not merged by tune export")
        weights = adapter_dir / keys.ADAPTER_MODEL_FILE
        if not weights.is_file():
            raise CheckpointError(
                f"{adapter_dir} has no {keys.ADAPTER_MODEL_FILE}; it contains: {describe_dir(adapter_dir)}"
            )
        self.modules: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in load_safetensors(weights).items():
            module, part = _peft_module(key, adapter_dir)
            self.modules.setdefault(module, {})[part] = value
        self._merged: set[str] = set()

    def merge(self, key: str, weight: torch.Tensor) -> torch.Tensor:
        module = key.removesuffix(".weight")
        parts = self.modules.get(module)
        if parts is None or not key.endswith(".weight"):
            return weight
        if "lora_A" not in parts or "lora_B" not in parts:
            raise CheckpointError(f"the adapter of {module} lacks lora_A or lora_B (it has {sorted(parts)})")
        self._merged.add(module)
        scaling = peft_scaling(module, self.config)
        # W' = W + (alpha / r) B A  [out, in]  (Hu et al. 2021, eq. 3)
        merged = weight.float() + scaling * (parts["lora_B"].float() @ parts["lora_A"].float())
        if "lora_magnitude_vector" in parts:
            # DoRA (Liu et al. 2024, eq. 5): W' = m * (W + s B A) / ||W + s B A||, the norm of each output row
            norm = merged.norm(p=2, dim=1, keepdim=True)
            merged = parts["lora_magnitude_vector"].float().view(-1, 1) * merged / norm
        return merged.to(weight.dtype)

    def check_all_merged(self) -> None:
        missing = sorted(set(self.modules) - self._merged)
        if missing:
            raise CheckpointError(
                f"the adapter adapts modules the base model does not have: {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''}; is --base the model the run fine-tuned?"
            )


def _peft_module(key: str, adapter_dir: Path) -> tuple[str, str]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (HF module name, ``lora_A``)."""
    name = key.removeprefix(_PEFT_PREFIX)
    for part in ("lora_A", "lora_B"):
        if name.endswith(f".{part}.weight"):
            return name.removesuffix(f".{part}.weight"), part
    if name.endswith(".lora_magnitude_vector"):
        return name.removesuffix(".lora_magnitude_vector"), "lora_magnitude_vector"
    raise CheckpointError(
        f"{adapter_dir}: the adapter holds {key}, which is no LoRA/DoRA weight of a linear layer; "
        "tune export merges lora_A/lora_B (and DoRA magnitudes) only"
    )


def _weight_files(directory: Path) -> list[Path]:
    for index in _INDEX_FILES:
        if (directory / index).is_file():
            weight_map = read_json(directory / index, "checkpoint index")["weight_map"]
            return [directory / name for name in sorted(set(weight_map.values()))]
    files = sorted(directory.glob(f"*{SAFETENSORS_SUFFIX}"))
    if not files:
        files = sorted(p for p in directory.glob("pytorch_model*.bin"))
    return files


def _output_name(path: Path, single: bool) -> str:
    # `.bin` inputs become safetensors under the names transformers looks for
    if single:
        return "model.safetensors"
    if path.suffix == SAFETENSORS_SUFFIX:
        return path.name
    return path.stem.replace("pytorch_model", "model") + SAFETENSORS_SUFFIX


def _hf_config(directory: Path) -> dict[str, Any]:
    if not (directory / "config.json").is_file():
        raise CheckpointError(
            f"{directory} has no config.json: `tune export` reads Hugging Face checkpoints; it contains: "
            f"{describe_dir(directory)}"
        )
    return read_json(directory / "config.json", "model config")


def _base_model_dir(checkpoint_dir: Path, adapter_dir: Path) -> Path:
    named = read_json(adapter_dir / keys.ADAPTER_CONFIG_FILE, "adapter config").get("base_model_name_or_path")
    if named and Path(named).expanduser().is_dir():
        return Path(named).expanduser()
    run_config = checkpoint_dir / keys.CONFIG_FILE
    if run_config.is_file():
        import yaml

        cfg = yaml.safe_load(run_config.read_text()) or {}
        run_base = (cfg.get("checkpointer") or {}).get("checkpoint_dir")
        if run_base and Path(run_base).expanduser().is_dir():
            return Path(run_base).expanduser()
    raise CheckpointError(
        f"{checkpoint_dir} holds only an adapter (save_adapter_weights_only) and its base model "
        f"{named or '(not named)'} is not a local directory; pass the model the run fine-tuned with --base DIR"
    )


def _check_free(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} exists and is not empty; choose another --out or remove it")


def _total_size(directory: Path, weight_map: Mapping[str, str]) -> int:
    from tune.training.checkpointing._io import read_safetensors_shapes

    total = 0
    for name in sorted(set(weight_map.values())):
        for dtype, shape in read_safetensors_shapes(directory / name).values():
            total += torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return total


def _copy_model_files(source: ExportSource, out: Path, dtype_name: str | None) -> None:
    """config.json (with the new dtype), tokenizer, generation config, chat template: every top-level file of the
    checkpoint (then of the base model) that is not weights, an index or run state."""
    copied = set()
    for directory in source.file_dirs():
        for path in sorted(directory.iterdir()):
            if not path.is_file() or path.name in copied or path.name in _RUN_FILES or path.name in _INDEX_FILES:
                continue
            if path.suffix in (SAFETENSORS_SUFFIX, *PICKLE_SUFFIXES) or path.name.startswith("."):
                continue
            copied.add(path.name)
            if path.name == "config.json" and dtype_name is not None:
                config = json.loads(path.read_text())
                config["dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"] = dtype_name
                save_json(config, out / path.name)
            else:
                shutil.copy2(path, out / path.name)
