"""Checkpointers: read a model in its published format, hand tune's state dict to the recipe, and write the
trained model (and LoRA/DoRA adapters, and the recipe state) back in the same format, atomically.

``FullModelHFCheckpointer`` (Hugging Face safetensors/bin, sharded with an index), ``FullModelMetaCheckpointer``
(``consolidated.00.pth``) and ``FullModelTorchTuneCheckpointer`` (tune's own keys) share one implementation and
differ only in how keys are converted and which files they expect.
"""

import json
import re
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from tune.modules.peft import dequantize
from tune.registry import ModelFamily, family_for_hf_model_type, get_model_family
from tune.training.checkpointing import _constants as keys
from tune.training.checkpointing._formats import (
    PEFT_PREFIX,
    StateDictConverter,
    adapter_to_peft,
    hf_to_meta,
    is_torchtune_layout,
    merge_adapter,
    meta_to_hf,
    peft_to_adapter,
    split_adapter,
    torchtune_to_tune,
    tune_to_torchtune,
)
from tune.training.checkpointing._io import (
    PICKLE_SUFFIXES,
    SAFETENSORS_SUFFIX,
    CheckpointError,
    describe_dir,
    download_hint,
    load_tensors,
    load_weights_file,
    missing_files_error,
    read_json,
    read_safetensors_shapes,
    save_json,
    save_safetensors,
    save_torch,
)
from tune.training.checkpointing._layout import (
    atomic_checkpoint_dir,
    checkpoint_dir_name,
    find_latest_checkpoint,
    prune_checkpoints,
    read_marker,
    remove_stale_temporaries,
)
from tune.training.checkpointing._state import get_rng_state, load_recipe_state, save_config, save_recipe_state
from tune.utils import get_logger, get_rank

log = get_logger(name=__name__)

_WEIGHT_SUFFIXES = (SAFETENSORS_SUFFIX, *PICKLE_SUFFIXES)
# Files of a model directory that are not copied to the output (weights and their indexes are rewritten).
_NOT_COPIED = {
    keys.SAFETENSORS_INDEX_FILE,
    keys.BIN_INDEX_FILE,
    keys.DOWNLOAD_RECORD_FILE,
    keys.ADAPTER_CONFIG_FILE,
    keys.CONFIG_FILE,
    keys.COMPLETE_MARKER,
}
_NON_RECIPE_KEYS = {keys.MODEL_KEY, keys.ADAPTER_KEY, keys.ADAPTER_CONFIG}
# torchtune's `model_type: REWARD` names a kind of model, not a family: a Llama-style sequence classifier whose
# family is config.json's `model_type` (read by FullModelHFCheckpointer)
_FAMILY_FROM_HF_CONFIG = "reward"
# a sequence classifier's head: tune's `output` projection, transformers' `score` (in a PEFT adapter, a module of
# `modules_to_save`, saved whole)
_HEAD_KEY = "output.weight"
_PEFT_SCORE_KEY = PEFT_PREFIX + "score.weight"


@dataclass
class _SourceTensor:
    file: str  # file name inside checkpoint_dir
    dtype: torch.dtype
    shape: tuple[int, ...]


def _resolve_relative(path: str | Path, *bases: Path) -> Path:
    path = Path(path)
    if path.is_absolute():
        return path
    for base in bases:
        if (base / path).exists():
            return base / path
    return bases[0] / path


def _check_dirs(checkpoint_dir: Path, output_dir: Path) -> None:
    source, target = checkpoint_dir.resolve(), output_dir.resolve()
    if target == source or source in target.parents:
        raise ValueError(
            f"output_dir ({output_dir}) is inside checkpoint_dir ({checkpoint_dir}). Saving there would mix trained "
            "weights with the originals (and a later run would read them as the base model). Choose an output_dir "
            "outside checkpoint_dir, e.g. `output_dir=/tmp/my_run`."
        )


def _is_sequence_classifier(hf_config: Mapping[str, Any]) -> bool:
    # transformers' *ForSequenceClassification models keep their head as `score`, never tied to the embeddings
    return any(str(name).endswith("ForSequenceClassification") for name in hf_config.get("architectures") or ())


def _model_part(module: str) -> str:
    # the top-level part of an HF module name: `vision_tower` of `vision_tower.vision_model.encoder...`, and of
    # `model.vision_tower.encoder...` (transformers 5's module tree)
    names = module.split(".")
    return names[1] if names[0] == "model" and len(names) > 2 else names[0]


def _parts_without_adapters(adapted: Collection[str], modules: Collection[str]) -> list[str]:
    """The top-level parts of the checkpoint that hold modules named like an adapted one (same last name) but no
    adapter; none when an adapted module is not among ``modules`` (names in another layout than the files')."""
    if not adapted or not set(adapted) <= set(modules):
        return []
    names = {module.rsplit(".", 1)[-1] for module in adapted}
    adapted_parts = {_model_part(module) for module in adapted}
    alike = {module for module in modules if module.rsplit(".", 1)[-1] in names and module not in adapted}
    return sorted({_model_part(module) for module in alike} - adapted_parts)


def _rename_head(state_dict: Mapping[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    return {(new + key[len(old) :] if key.startswith(old) else key): value for key, value in state_dict.items()}


def _formatted_files(spec: Mapping[str, Any]) -> list[str]:
    # torchtune's form: {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00002"}
    unknown = set(spec) - {"filename_format", "max_filename"}
    if unknown or "filename_format" not in spec or "max_filename" not in spec:
        raise ValueError(
            f"checkpoint_files as a mapping needs exactly 'filename_format' and 'max_filename', got {sorted(spec)}. "
            "Example: {filename_format: 'model-{}-of-{}.safetensors', max_filename: '00004'}."
        )
    fmt, last = str(spec["filename_format"]), str(spec["max_filename"])
    if not last.isdigit() or fmt.count("{}") != 2:
        raise ValueError(
            f"checkpoint_files: max_filename must be digits (got {last!r}) and filename_format must contain two "
            f"'{{}}' placeholders (got {fmt!r})."
        )
    return [fmt.format(str(index).zfill(len(last)), last) for index in range(1, int(last) + 1)]


class _Checkpointer:
    """Shared implementation; see the public subclasses for the arguments."""

    _default_files: tuple[str, ...] = ()
    _needs_family = True
    format_name = ""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        checkpoint_files: list[str] | Mapping[str, Any] | None = None,
        model_type: str | None = None,
        output_dir: str | Path | None = None,
        adapter_checkpoint: str | Path | None = None,
        recipe_checkpoint: str | Path | None = None,
        resume_from_checkpoint: bool = False,
        safe_serialization: bool = True,
        should_load_recipe_state: bool = False,
        keep_last_n_checkpoints: int | None = None,
        save_adapter_weights_only: bool = False,
    ) -> None:
        if output_dir is None:
            raise ValueError(f"{type(self).__name__} needs `output_dir`: the directory the checkpoints are saved to.")
        self._checkpoint_dir = Path(checkpoint_dir)
        self._output_dir = Path(output_dir)
        _check_dirs(self._checkpoint_dir, self._output_dir)
        if self._needs_family and model_type is None:
            raise ValueError(f"{type(self).__name__} needs `model_type` (e.g. LLAMA3_2) to convert the weights.")
        if isinstance(model_type, Enum):  # torchtune's ModelType members
            model_type = model_type.value
        self._model_type = model_type
        self._family: ModelFamily | None = None
        if model_type is not None and str(model_type).lower() != _FAMILY_FROM_HF_CONFIG:
            self._family = get_model_family(model_type)
        self._safe_serialization = safe_serialization
        self._keep_last_n = keep_last_n_checkpoints
        if keep_last_n_checkpoints is not None and (
            isinstance(keep_last_n_checkpoints, bool)
            or not isinstance(keep_last_n_checkpoints, int)
            or keep_last_n_checkpoints <= 0
        ):
            raise ValueError(
                "keep_last_n_checkpoints must be a positive integer or null (keep all), got "
                f"{keep_last_n_checkpoints!r}."
            )
        self._save_adapter_weights_only = save_adapter_weights_only
        self._files = self._resolve_files(checkpoint_files)
        self._adapter_checkpoint = adapter_checkpoint
        self._recipe_checkpoint = recipe_checkpoint
        self._source_layout: dict[str, _SourceTensor] | None = None
        # torchtune 0.6 renamed resume_from_checkpoint to should_load_recipe_state; either one resumes
        resume = resume_from_checkpoint or should_load_recipe_state
        self._resume_dir = self._find_resume_dir() if resume else None
        self._config: dict[str, Any] = {}
        self._classifier = False  # the input is a sequence classifier (read by the formats that know one)
        self._classifier_pad_token_id: int | None = None  # set by as_sequence_classifier: the output is one
        self._num_labels: int | None = None  # the head's rows, as last saved
        self._setup_format()
        if self._family is None and str(model_type).lower() == _FAMILY_FROM_HF_CONFIG:
            raise ValueError(
                f"model_type {model_type!r} takes the model family from a Hugging Face config.json, which "
                f"{type(self).__name__} does not read. Use FullModelHFCheckpointer, or set model_type to the "
                "family (e.g. MISTRAL)."
            )
        if get_rank() == 0:
            remove_stale_temporaries(self._output_dir)

    # ----------------------------------------------------------------------------------------- format hooks
    def _setup_format(self) -> None:
        """Reads what the format needs besides the weights (config.json, params.json)."""

    def _to_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _from_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _adapter_to_tune(self, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An adapter file in tune's keys -> tune's layout (a format may keep it in its own layout)."""
        return adapter

    def _adapter_from_tune(self, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`_adapter_to_tune`, for adapters written with tune's keys."""
        return adapter

    def _hf_config(self) -> dict[str, Any]:
        """The HF config dict that the family's converters receive."""
        return self._config

    def as_sequence_classifier(self, pad_token_id: int) -> None:
        """Reads and writes the model as a sequence classifier (a reward model) from here on; see
        :meth:`FullModelHFCheckpointer.as_sequence_classifier`.

        Raises:
            ValueError: always: only the Hugging Face format has sequence-classifier checkpoints.
        """
        raise ValueError(
            f"{type(self).__name__} cannot write a sequence classifier (reward model): use "
            "tune.training.FullModelHFCheckpointer, whose output loads as AutoModelForSequenceClassification."
        )

    def _passthrough_keys(self, written: set[str]) -> list[str]:
        """Keys of the input files that a written model carries over unchanged (none but in the HF format)."""
        return []

    def _peft_excluded_modules(self, adapted: Collection[str]) -> str | None:
        """PEFT's ``exclude_modules`` for an adapter of the HF modules ``adapted`` (a regex on module names), or
        None."""
        return None

    # ----------------------------------------------------------------------------------------- input files
    def _resolve_files(self, spec: list[str] | Mapping[str, Any] | str | None) -> list[Path]:
        if isinstance(spec, str):
            spec = [spec]
        if isinstance(spec, Mapping):
            names = _formatted_files(spec)
        elif spec is not None:
            names = [str(name) for name in spec]
        else:
            names = self._discover_files()
        if not names:
            raise CheckpointError(missing_files_error(self._checkpoint_dir, ["(no weight files)"], "Model weights"))
        paths = [_resolve_relative(name, self._checkpoint_dir) for name in names]
        missing = [str(name) for name, path in zip(names, paths) if not path.is_file()]
        if missing:
            raise CheckpointError(missing_files_error(self._checkpoint_dir, missing))
        return paths

    def _discover_files(self) -> list[str]:
        directory = self._checkpoint_dir
        if not directory.is_dir():
            raise CheckpointError(
                f"checkpoint_dir {directory} does not exist. Fetch the model with `{download_hint(directory)}`."
            )
        for index_name in (keys.SAFETENSORS_INDEX_FILE, keys.BIN_INDEX_FILE):
            index = directory / index_name
            if index.is_file():
                weight_map = read_json(index, "The checkpoint index").get("weight_map", {})
                return sorted(set(weight_map.values()))
        present = [name for name in self._default_files if (directory / name).is_file()]
        if present:
            return present
        for suffix in _WEIGHT_SUFFIXES:
            found = sorted(p.name for p in directory.glob(f"*{suffix}") if p.name != keys.ADAPTER_MODEL_FILE)
            if found:
                return found
        return []

    def _layout(self) -> dict[str, _SourceTensor]:
        # dtype, shape and file of every tensor of the original checkpoint (headers only for safetensors).
        if self._source_layout is None:
            layout = {}
            for path in self._files:
                if path.suffix == SAFETENSORS_SUFFIX:
                    for key, (dtype, shape) in read_safetensors_shapes(path).items():
                        layout[key] = _SourceTensor(path.name, dtype, shape)
                else:
                    for key, tensor in load_weights_file(path).items():
                        layout[key] = _SourceTensor(path.name, tensor.dtype, tuple(tensor.shape))
            self._source_layout = layout
        return self._source_layout

    def _read_files(self, paths: list[Path]) -> dict[str, torch.Tensor]:
        state_dict: dict[str, torch.Tensor] = {}
        for path in paths:
            for key, tensor in load_weights_file(path).items():
                if key in state_dict:
                    raise CheckpointError(f"Key {key!r} appears in more than one checkpoint file (again in {path}).")
                state_dict[key] = tensor
        return state_dict

    # ----------------------------------------------------------------------------------------- loading
    def _find_resume_dir(self) -> Path:
        latest = find_latest_checkpoint(self._output_dir, format_name=self.format_name)
        if latest is None:
            raise CheckpointError(
                f"resume_from_checkpoint is true but {self._output_dir} holds no complete intermediate checkpoint "
                f"(a step_N/ or epoch_N/ directory with {keys.RECIPE_STATE_FILE} and a {keys.COMPLETE_MARKER} "
                f"marker). It holds: {describe_dir(self._output_dir)}. Set `resume_from_checkpoint: false` to start "
                "a new run, or point `output_dir` at the run to resume."
            )
        log.info(f"Resuming from {latest}.")
        return latest

    @property
    def resume_dir(self) -> Path | None:
        """The checkpoint directory this run resumes from (None when not resuming)."""
        return self._resume_dir

    @property
    def model_family(self) -> str | None:
        """The registry name of the model family the weights convert with (for ``model_type: REWARD``, the family
        ``config.json`` names), or None for a checkpointer that needs none; recipes look the family's sharding
        rule and tensor-parallel plan up by it."""
        return self._family.name if self._family is not None else None

    def load_checkpoint(self) -> dict[str, Any]:
        """Loads the model (and, when resuming, the adapter and recipe state) in tune's keys.

        When resuming a LoRA run, the base weights come from ``checkpoint_dir`` and the adapter from the newest
        checkpoint in ``output_dir``; when resuming a full fine-tune, the weights come from that checkpoint.

        Returns:
            dict[str, Any]: ``"model"`` (tune state dict); ``"adapter"`` when resuming a LoRA run or when
            ``adapter_checkpoint`` is set; when resuming, ``"recipe_state"`` and, as in torchtune, each recipe-state
            entry (``"optimizer"``, ``"epochs_run"``, ``"steps_run"``, ``"dataloader"``, ``"rng_state"``, ...) at
            the top level too.

        Raises:
            ValueError: for missing, unsafe or corrupt files, or a resumed model whose shapes differ from the base.
        """
        marker = read_marker(self._resume_dir) if self._resume_dir is not None else None
        if marker is not None and marker.get("model_files") and not marker.get("adapter"):
            names = [name for name in marker["model_files"] if Path(name).suffix in _WEIGHT_SUFFIXES]
            resumed = [self._resume_dir / name for name in names]
            raw = self._read_files(resumed)
            self._check_resumed_shapes(raw, self._resume_dir)
        else:
            raw = self._read_files(self._files)
        result: dict[str, Any] = {keys.MODEL_KEY: self._to_tune(raw)}
        # a resumed run continues from the adapter it saved, not from the one it started from (adapter_checkpoint)
        adapter_path = self._adapter_checkpoint
        if marker is not None and marker.get("adapter"):
            adapter_path = self._resume_dir
        if adapter_path is not None:
            result[keys.ADAPTER_KEY] = self.load_adapter(adapter_path)
        if self._resume_dir is not None:
            recipe_path = self._resume_dir / keys.RECIPE_STATE_FILE
            if self._recipe_checkpoint is not None:
                recipe_path = _resolve_relative(self._recipe_checkpoint, self._checkpoint_dir, self._output_dir)
            state = load_recipe_state(recipe_path, required=(keys.RNG_KEY,))  # save_checkpoint always writes it
            result.update(state)
            result[keys.RECIPE_STATE_KEY] = state
        return result

    def _check_resumed_shapes(self, resumed: Mapping[str, torch.Tensor], where: Path) -> None:
        layout = self._layout()
        for key, tensor in resumed.items():
            if key in layout and tuple(tensor.shape) != layout[key].shape:
                raise CheckpointError(
                    f"Shape mismatch for {key!r}: {tuple(tensor.shape)} in the checkpoint {where} but "
                    f"{layout[key].shape} in the base model {self._checkpoint_dir / layout[key].file}. The output_dir "
                    "holds a different model; point output_dir at this model's run or set "
                    "resume_from_checkpoint: false."
                )

    def load_adapter(self, path: str | Path) -> dict[str, torch.Tensor]:
        """Loads LoRA/DoRA adapter weights into tune's keys, from our output or any PEFT adapter directory.

        Args:
            path (str | Path): a directory holding ``adapter_model.safetensors`` (PEFT format or tune keys), a
                checkpoint directory written by :meth:`save_checkpoint` (its ``adapter/``), or the weights file;
                relative paths are looked up in ``checkpoint_dir``, then ``output_dir``.

        Returns:
            dict[str, torch.Tensor]: adapter weights (``layers.0.attn.q_proj.lora_a.weight``, ...), ready for
            ``model.load_state_dict(adapter, strict=False)`` or :func:`load_adapter_weights`.

        Raises:
            ValueError: if the file is missing or unsafe, or the PEFT config uses a scaling tune does not implement.
        """
        path = _resolve_relative(path, self._checkpoint_dir, self._output_dir)
        if path.is_dir() and (path / keys.ADAPTER_SUBDIR / keys.ADAPTER_MODEL_FILE).is_file():
            path = path / keys.ADAPTER_SUBDIR  # a checkpoint directory written by save_checkpoint
        file = path / keys.ADAPTER_MODEL_FILE if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(missing_files_error(file.parent, [file.name], "Adapter weights"))
        config_file = file.parent / keys.ADAPTER_CONFIG_FILE
        config = None
        if config_file.is_file():
            config = read_json(config_file, "The adapter config")
            if config.get("use_rslora"):
                raise CheckpointError(
                    f"{config_file} sets use_rslora=true (scaling alpha/sqrt(r)); tune's LoRA scales by alpha/r, so "
                    "this adapter would compute different outputs. Merge it with PEFT and load the merged model."
                )
        state = load_weights_file(file)
        head = state.pop(_PEFT_SCORE_KEY, None)  # a sequence classifier's head, saved whole (modules_to_save)
        if head is not None:
            return {**self._load_peft_or_tune_adapter(state, file, config), _HEAD_KEY: head}
        return self._load_peft_or_tune_adapter(state, file, config)

    def _load_peft_or_tune_adapter(
        self, state: dict[str, torch.Tensor], file: Path, config: Mapping[str, Any] | None
    ) -> dict[str, torch.Tensor]:
        # --- MoE expert adapters (tune keys, in their own file: PEFT cannot load them); see _formats.py ---
        from tune.training.checkpointing._formats import load_expert_adapter

        state.update(load_expert_adapter(file.parent))
        # --- end MoE ---
        if any(key.startswith(PEFT_PREFIX) for key in state):
            hf_to_tune = self._converter("hf_to_tune")
            return peft_to_adapter(
                state,
                hf_to_tune,
                self._hf_config(),
                peft_config=config,
                adapter_converter=self._family.adapter_converter,
            )
        return self._adapter_to_tune(state)

    def _converter(self, name: str) -> StateDictConverter:
        converter = getattr(self._family, name, None) if self._family is not None else None
        if converter is None:
            family = self._family.name if self._family is not None else None
            raise ValueError(
                f"Converting weights needs the `{name}` converter of a registered model family, but model_type="
                f"{self._model_type!r} (family {family!r}) provides none. Set `model_type` to a family that does."
            )
        return converter

    # ----------------------------------------------------------------------------------------- saving
    def save_checkpoint(
        self,
        state_dict: dict[str, Any],
        epoch: int | None = None,
        step: int | None = None,
        *,
        intermediate_checkpoint: bool = False,
        adapter_only: bool = False,
        config: Mapping[str, Any] | str | None = None,
    ) -> Path:
        """Writes a checkpoint to ``output_dir/step_{step}/`` (or ``epoch_{epoch}/`` without a step), atomically.

        Args:
            state_dict (dict[str, Any]): ``"model"``: tune state dict (merged weights, or a LoRA model's full state
                dict, whose adapters are then merged for the full-model output); ``"adapter"``: adapter weights
                (taken from ``"model"`` when absent); ``"adapter_config"``: ``{"r", "lora_alpha", ...}`` (needed
                with adapters); every other key is recipe state (``"optimizer"``, ``"lr_scheduler"``,
                ``"epochs_run"``, ``"steps_run"``, ``"dataloader"``, ...), written for intermediate checkpoints,
                with the RNG states added under ``"rng_state"`` unless given.
            epoch (int | None): epochs completed.
            step (int | None): global steps completed; names the directory when given.
            intermediate_checkpoint (bool): also write ``recipe_state.pt`` so the run can resume. Default False.
            adapter_only (bool): write only the adapter (no merged model). Default False.
            config (Mapping[str, Any] | str | None): the resolved run config, written as ``config.yaml``.

        Returns:
            Path: the published checkpoint directory.

        Raises:
            ValueError: if neither epoch nor step is given, or adapters come without ``adapter_config``.
            TypeError: for ``step=True`` (torchtune's positional ``intermediate_checkpoint``), sharded DTensors
                in ``"model"``, or recipe state that ``torch.load(weights_only=True)`` could not read back.
        """
        if isinstance(step, bool):  # torchtune's third positional argument was intermediate_checkpoint
            raise TypeError(
                f"save_checkpoint got step={step!r}; pass intermediate_checkpoint by keyword: "
                "save_checkpoint(state_dict, epoch, step, intermediate_checkpoint=True)."
            )
        name = checkpoint_dir_name(epoch, step)
        model = dict(state_dict.get(keys.MODEL_KEY) or {})
        _, adapter_in_model = split_adapter(model)
        adapter = dict(state_dict.get(keys.ADAPTER_KEY) or adapter_in_model)
        adapter_config = dict(state_dict.get(keys.ADAPTER_CONFIG) or {})
        if (adapter or adapter_in_model) and "lora_alpha" not in adapter_config:
            raise ValueError(
                "The state dict holds LoRA/DoRA adapters but no 'adapter_config' with 'r' and 'lora_alpha'; pass "
                "state_dict['adapter_config'] = {'r': lora_rank, 'lora_alpha': lora_alpha}."
            )
        if adapter_in_model:
            model = merge_adapter(model, float(adapter_config["lora_alpha"]))
        if self._classifier_pad_token_id is not None:  # the head trains in full: the adapter carries it
            head = adapter.get(_HEAD_KEY, model.get(_HEAD_KEY))
            if adapter and head is not None:
                adapter[_HEAD_KEY] = head
            if head is not None:
                self._num_labels = int(head.shape[0])
        write_model = bool(model) and not (adapter_only or self._save_adapter_weights_only)
        marker: dict[str, Any] = {"format": self.format_name, "epoch": epoch, "global_step": step}
        with atomic_checkpoint_dir(self._output_dir, name, marker) as directory:
            marker["model_files"] = self._write_model(model, directory) if write_model else []
            marker["adapter"] = bool(adapter)
            if adapter:
                (directory / keys.ADAPTER_SUBDIR).mkdir()
                self._write_adapter(adapter, adapter_config, directory / keys.ADAPTER_SUBDIR)
            marker["recipe_state"] = intermediate_checkpoint
            if intermediate_checkpoint:
                recipe_state = {k: v for k, v in state_dict.items() if k not in _NON_RECIPE_KEYS}
                recipe_state.setdefault(keys.RNG_KEY, get_rng_state())
                save_recipe_state(recipe_state, directory / keys.RECIPE_STATE_FILE)
            if config is not None:
                save_config(config, directory)
            self._copy_extra_files(directory)
        final = self._output_dir / name
        log.info(f"Saved checkpoint to {final} ({', '.join(marker['model_files']) or 'adapter only'}).")
        prune_checkpoints(self._output_dir, self._keep_last_n)
        return final

    def _output_name(self, source_name: str) -> str:
        path = Path(source_name)
        if self._safe_serialization:
            if path.suffix == SAFETENSORS_SUFFIX:
                return source_name
            return path.stem.replace("pytorch_model", "model") + SAFETENSORS_SUFFIX
        if path.suffix in PICKLE_SUFFIXES:
            return source_name
        return path.stem.replace("model", "pytorch_model", 1) + ".bin"

    def _write_model(self, tune_state: dict[str, torch.Tensor], directory: Path) -> list[str]:
        sharded = [key for key, value in tune_state.items() if hasattr(value, "full_tensor")]
        if sharded:
            raise TypeError(
                f"The model state dict holds sharded DTensors (e.g. {sharded[0]!r}). Gather it first with "
                "tune.training.gather_full_state_dict(model) and save on rank 0, or use DistributedCheckpointer."
            )
        # NF4 (QLoRA) base weights are written dense, in the dtype they report.
        converted = self._from_tune({key: dequantize(value) for key, value in tune_state.items()})
        layout = self._layout()
        default_file = self._files[-1].name
        shards: dict[str, dict[str, torch.Tensor]] = {self._output_name(p.name): {} for p in self._files}
        weight_map = {}
        for key, tensor in converted.items():
            source = layout.get(key)
            tensor = tensor.detach()
            if source is not None and tensor.is_floating_point() and tensor.dtype != source.dtype:
                tensor = tensor.to(source.dtype)  # the input's dtype: a bf16 model stays bf16
            file = self._output_name(source.file if source is not None else default_file)
            shards[file][key] = tensor
            weight_map[key] = file
        for key, tensor in self._read_passthrough(set(converted)).items():
            file = self._output_name(layout[key].file)  # the file it came from, under its output name
            shards[file][key] = tensor
            weight_map[key] = file
        written = []
        for file, shard in shards.items():
            if not shard:
                continue
            if self._safe_serialization:
                save_safetensors(shard, directory / file)
            else:
                save_torch(shard, directory / file)
            written.append(file)
        if len(written) > 1 or self._had_index():
            index_name = keys.SAFETENSORS_INDEX_FILE if self._safe_serialization else keys.BIN_INDEX_FILE
            total = sum(t.numel() * t.element_size() for shard in shards.values() for t in shard.values())
            save_json({"metadata": {"total_size": total}, "weight_map": weight_map}, directory / index_name)
            written.append(index_name)
        return written

    def _read_passthrough(self, written: set[str]) -> dict[str, torch.Tensor]:
        # Read now, at save time, from the input files: nothing of them is held while training runs.
        keys_by_file: dict[str, list[str]] = {}
        layout = self._layout()
        for key in self._passthrough_keys(written):
            keys_by_file.setdefault(layout[key].file, []).append(key)
        paths = {path.name: path for path in self._files}
        tensors: dict[str, torch.Tensor] = {}
        for name, file_keys in keys_by_file.items():
            tensors.update(load_tensors(paths[name], file_keys))
        if tensors:
            log.info(f"Carried {len(tensors)} tensors the model has no module for over from {self._checkpoint_dir}.")
        return tensors

    def _had_index(self) -> bool:
        return any((self._checkpoint_dir / n).is_file() for n in (keys.SAFETENSORS_INDEX_FILE, keys.BIN_INDEX_FILE))

    def _write_adapter(
        self, adapter: dict[str, torch.Tensor], adapter_config: Mapping[str, Any], directory: Path
    ) -> None:
        alphas: dict[str, float] = {}
        adapter = dict(adapter)
        head = adapter.pop(_HEAD_KEY, None) if self._classifier_pad_token_id is not None else None
        if self._family is not None and self._family.tune_to_hf is not None:
            weights, ranks, alphas = adapter_to_peft(
                adapter,
                self._family.tune_to_hf,
                self._hf_config(),
                lora_alpha=float(adapter_config["lora_alpha"]),
                adapter_converter=self._family.adapter_converter,  # Phi-3's fused projections, say
            )
        else:  # no HF mapping known (native format without a family): keep tune's keys
            weights = self._adapter_from_tune(dict(adapter))
            suffix = ".lora_a.weight"
            ranks = {k[: -len(suffix)]: v.shape[0] for k, v in adapter.items() if k.endswith(suffix)}
        rank = int(adapter_config.get("r") or max(ranks.values()))
        use_dora = any(k.endswith("magnitude") for k in adapter)
        if head is not None:
            weights[_PEFT_SCORE_KEY] = head.detach()
        save_safetensors(weights, directory / keys.ADAPTER_MODEL_FILE)
        # --- MoE expert adapters (tune keys, in their own file: PEFT cannot load them); see _formats.py ---
        from tune.training.checkpointing._formats import save_expert_adapter

        save_expert_adapter(adapter, directory)
        # --- end MoE ---
        peft_config = self._peft_config(adapter_config, rank, ranks, alphas, use_dora)
        if head is not None:  # PEFT's sequence-classification adapter: the score head is saved whole
            peft_config.update(task_type="SEQ_CLS", modules_to_save=["score"])
        excluded = self._peft_excluded_modules(ranks)
        if excluded is not None:  # modules of the same names outside tune's model (a vision tower's q_proj)
            peft_config["exclude_modules"] = excluded
        save_json(peft_config, directory / keys.ADAPTER_CONFIG_FILE)

    def _peft_config(
        self,
        adapter_config: Mapping[str, Any],
        rank: int,
        ranks: Mapping[str, int],
        alphas: Mapping[str, float],
        use_dora: bool,
    ) -> dict[str, Any]:
        converter = self._family.adapter_converter if self._family is not None else None
        exact = converter is not None and converter.exact_targets  # full module names (see AdapterConverter)
        return {
            "base_model_name_or_path": self._base_model_name(),
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": rank,
            "lora_alpha": float(adapter_config["lora_alpha"]),
            "lora_dropout": float(adapter_config.get("lora_dropout", 0.0)),
            "target_modules": sorted(ranks) if exact else sorted({module.rsplit(".", 1)[-1] for module in ranks}),
            "rank_pattern": {module: r for module, r in ranks.items() if r != rank},
            "alpha_pattern": dict(alphas),  # fused modules (Phi-3's qkv_proj): n * alpha for rank n * r
            "use_dora": use_dora,
            "use_rslora": False,
            "bias": "none",
            "fan_in_fan_out": False,
            "inference_mode": True,
            "init_lora_weights": True,
            "modules_to_save": None,
        }

    def _base_model_name(self) -> str:
        record = self._checkpoint_dir / keys.DOWNLOAD_RECORD_FILE
        if record.is_file():
            try:
                repo_id = json.loads(record.read_text()).get("repo_id")
            except ValueError:
                repo_id = None
            if repo_id:
                return str(repo_id)
        return str(self._checkpoint_dir.resolve())

    def _copy_extra_files(self, directory: Path) -> None:
        # config.json, tokenizer files, generation_config.json, params.json, ...: everything but the weights.
        for path in sorted(self._checkpoint_dir.iterdir()):
            if not path.is_file() or path.suffix in _WEIGHT_SUFFIXES or path.name in _NOT_COPIED:
                continue
            if path.name == keys.RECIPE_STATE_FILE or (directory / path.name).exists():
                continue
            shutil.copy2(path, directory / path.name)


class FullModelHFCheckpointer(_Checkpointer):
    """Reads and writes Hugging Face checkpoints: ``config.json`` plus safetensors (or ``.bin``) weights, single
    or sharded with an index.

    Weights are memory-mapped and converted to tune's keys with the converter that the model family registered
    (``tune.registry``). Saving writes the same file split, names and dtypes as the input (``.bin`` inputs become
    safetensors unless ``safe_serialization=False``) with the index, copies ``config.json``, tokenizer and
    generation files, and for LoRA/DoRA writes ``adapter/adapter_model.safetensors`` + ``adapter/adapter_config.json``
    in the PEFT format. The output directory loads with ``transformers.AutoModelForCausalLM.from_pretrained`` (the
    merged model) and ``step_N/adapter`` with ``peft.PeftModel.from_pretrained`` on the base model. (The adapter has
    its own subdirectory because transformers, given a directory holding a model and an adapter, applies the
    adapter on top of the already merged weights.)

    Weights of the input that the family builds no module for (``ModelFamily.passthrough_hf_keys``: the vision
    tower and projector of a multimodal Gemma 3 checkpoint) are written back unchanged with every model: read from
    the input files when the checkpoint is saved (not held during training), into the file they came from, in their
    own dtype, and listed in the index. A PEFT adapter of such a checkpoint leaves their modules out
    (``exclude_modules``), as it leaves out the parts of the model that hold no adapter (the vision tower of a
    vision-language model with LoRA in its language model only).

    A reward or classifier model (``config.json`` ``architectures``: ``*ForSequenceClassification``) loads into
    tune's classifier builders (``mistral_classifier``, ``llama2_classifier``): its ``score`` head is their
    ``output`` layer, and is written back as ``score``, so the output loads with
    ``transformers.AutoModelForSequenceClassification``.

    Args:
        checkpoint_dir (str | Path): the downloaded model directory.
        checkpoint_files (list[str] | Mapping | None): weight files in ``checkpoint_dir``; torchtune's form
            ``{"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00004"}``; or None to read the
            index (``model.safetensors.index.json``) or every ``*.safetensors`` file.
        model_type (str): the model family (``LLAMA3_2``, ``qwen2_5``, ...), looked up in ``tune.registry``;
            torchtune's ``REWARD`` takes the family from ``config.json``'s ``model_type``.
        output_dir (str | Path): where ``step_N/`` and ``epoch_N/`` checkpoints go; not inside ``checkpoint_dir``.
        adapter_checkpoint (str | Path | None): an adapter to load (a PEFT directory or our adapter file),
            relative to ``checkpoint_dir`` or absolute. Default None.
        recipe_checkpoint (str | Path | None): an explicit ``recipe_state.pt`` to resume from instead of the
            newest checkpoint's. Default None.
        resume_from_checkpoint (bool): resume from the newest complete checkpoint in ``output_dir``. Default False.
        safe_serialization (bool): write safetensors (True) or ``.bin`` pickles of tensors. Default True.
        should_load_recipe_state (bool): torchtune's newer name for ``resume_from_checkpoint``; either one being
            True resumes. Default False.
        keep_last_n_checkpoints (int | None): delete older checkpoints beyond this many. Default None (keep all).
        save_adapter_weights_only (bool): for LoRA, write the adapter without the merged model. Default False.

    Raises:
        ValueError: for missing files (listing the directory and the ``tune download`` command), an
            ``output_dir`` inside ``checkpoint_dir``, a missing ``config.json``, or an unknown ``model_type``.
    """

    _default_files = ("model.safetensors",)
    format_name = "hf"

    def _setup_format(self) -> None:
        config_path = self._checkpoint_dir / "config.json"
        if not config_path.is_file():
            raise CheckpointError(missing_files_error(self._checkpoint_dir, ["config.json"], "The Hugging Face config"))
        self._config = read_json(config_path, "The Hugging Face config")
        if self._family is None and self._model_type is not None:  # REWARD: the family config.json names
            self._family = family_for_hf_model_type(str(self._config.get("model_type")))
        self._classifier = _is_sequence_classifier(self._config)
        pattern = self._family.passthrough_hf_keys
        try:
            self._passthrough = re.compile(pattern) if pattern else None
        except re.error as error:
            raise ValueError(
                f"The model family {self._family.name!r} declares passthrough_hf_keys={pattern!r}, which is not a "
                f"valid regular expression: {error}."
            ) from error
        if self._passthrough is not None:
            self._layout()  # the files' headers as the run starts: a file changed meanwhile is named at save time

    def _passthrough_keys(self, written: set[str]) -> list[str]:
        # the input's weights the family declared as having no module in tune, unless the model wrote them itself
        if self._passthrough is None:
            return []
        return [key for key in self._layout() if key not in written and self._passthrough.match(key)]

    def _peft_excluded_modules(self, adapted: Collection[str]) -> str | None:
        # PEFT matches target_modules by the last name part: keep its LoRA layers out of the carried-over modules,
        # and out of the parts of the model with no adapter (a vision tower's q_proj when LoRA is in the language
        # model only: PEFT would add untrained layers there and warn of missing adapter weights)
        patterns = [f"(?:{self._passthrough.pattern}).*"] if self._passthrough_keys(set()) else []
        idle = _parts_without_adapters(adapted, {key.rsplit(".", 1)[0] for key in self._layout()})
        if idle:
            # the files' part name, under transformers 5's `model.` prefix in the module tree too
            patterns.append(rf"(?:model\.)?(?:{'|'.join(re.escape(part) for part in idle)})\..*")
        return "|".join(patterns) or None

    def as_sequence_classifier(self, pad_token_id: int) -> None:
        """Reads and writes the model as a Hugging Face sequence classifier (a reward model) from here on, whatever
        the input is: call it before :meth:`load_checkpoint`.

        From a causal language model, the state dict read holds its LM head as ``output.weight`` (the embeddings
        where they are tied), for :func:`tune.training.update_state_dict_for_classifier` to replace by the
        classifier's fresh head. Every checkpoint saved is then a ``<Family>ForSequenceClassification`` model:
        ``config.json`` with that architecture, ``num_labels`` (``id2label``) from the head's rows,
        ``pad_token_id`` (transformers finds each sequence's last token with it) and untied embeddings, the head as
        ``score.weight``; a LoRA adapter is a PEFT ``SEQ_CLS`` adapter carrying the head whole
        (``modules_to_save: ["score"]``). A resumed run reads these back.

        Args:
            pad_token_id (int): the tokenizer's padding id.

        Raises:
            ValueError: if the input's ``architectures`` has no sequence-classification counterpart
                (``*ForCausalLM``).
        """
        self._classifier_architecture()  # fails now, not at the first save
        self._classifier_pad_token_id = int(pad_token_id)

    def _classifier_architecture(self) -> str:
        architectures = [str(name) for name in self._config.get("architectures") or ()]
        for name in architectures:
            if name.endswith("ForSequenceClassification"):
                return name
            if name.endswith("ForCausalLM"):
                return name.removesuffix("ForCausalLM") + "ForSequenceClassification"
        raise ValueError(
            f"{self._checkpoint_dir / 'config.json'} names architectures {architectures}; a sequence classifier is "
            "made from a *ForCausalLM (or *ForSequenceClassification) checkpoint of a text model."
        )

    # A sequence classifier's `score` head is the output projection of tune's classifier builders: the family's
    # converter handles it as the (untied) `lm_head`.
    def _to_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scored = self._classifier or (
            self._classifier_pad_token_id is not None and any(k.startswith("score.") for k in state_dict)
        )  # a classifier input, or a resumed run's own classifier checkpoint
        if not scored:
            converted = self._converter("hf_to_tune")(state_dict, self._config)
            if self._classifier_pad_token_id is not None and _HEAD_KEY not in converted:
                converted[_HEAD_KEY] = converted["tok_embeddings.weight"]  # the tied LM head, replaced by the recipe
            return converted
        untied = {**self._config, "tie_word_embeddings": False}
        return self._converter("hf_to_tune")(_rename_head(state_dict, "score.", "lm_head."), untied)

    def _from_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._classifier and self._classifier_pad_token_id is None:
            return self._converter("tune_to_hf")(state_dict, self._config)
        untied = {**self._config, "tie_word_embeddings": False}
        return _rename_head(self._converter("tune_to_hf")(state_dict, untied), "lm_head.", "score.")

    def _copy_extra_files(self, directory: Path) -> None:
        super()._copy_extra_files(directory)
        if self._classifier_pad_token_id is None:
            return
        num_labels = self._num_labels or len(self._config.get("id2label") or {}) or 1
        labels = [f"LABEL_{index}" for index in range(num_labels)]
        classifier = {
            **self._config,
            "architectures": [self._classifier_architecture()],
            "id2label": dict(enumerate(labels)),
            "label2id": {label: index for index, label in enumerate(labels)},
            "pad_token_id": self._classifier_pad_token_id,
            "tie_word_embeddings": False,  # the head is its own matrix
        }
        save_json(classifier, directory / "config.json")


class FullModelMetaCheckpointer(_Checkpointer):
    """Reads and writes Meta's reference format: ``consolidated.00.pth`` with ``params.json`` (Llama-style models).

    Meta rotates interleaved pairs in RoPE while tune uses the rotate_half layout, so the q/k projections are
    permuted on the way in and out (:func:`permute_meta_to_hf`); the rest of the key map goes through the family's
    Hugging Face converter. ``params.json`` (``dim``, ``n_heads``, ``n_kv_heads``) gives the head counts. The
    output is ``consolidated.00.pth`` in the input's dtype; adapters are written in the PEFT format.

    Args:
        checkpoint_dir (str | Path): the directory with ``consolidated.00.pth`` and ``params.json``.
        checkpoint_files (list[str] | None): default ``["consolidated.00.pth"]``; only one file (no
            model-parallel shards).
        model_type (str): the model family, looked up in ``tune.registry``.
        output_dir (str | Path): where checkpoints go.
        adapter_checkpoint (str | Path | None): as for :class:`FullModelHFCheckpointer`.
        recipe_checkpoint (str | Path | None): as for :class:`FullModelHFCheckpointer`.
        resume_from_checkpoint (bool): as for :class:`FullModelHFCheckpointer`.
        should_load_recipe_state (bool): as for :class:`FullModelHFCheckpointer`.
        safe_serialization (bool): ignored: the format is a ``torch.save`` file.
        keep_last_n_checkpoints (int | None): as for :class:`FullModelHFCheckpointer`.
        save_adapter_weights_only (bool): as for :class:`FullModelHFCheckpointer`.

    Raises:
        ValueError: for a missing ``params.json`` or several model-parallel shards, besides the errors of
            :class:`FullModelHFCheckpointer`.
    """

    _default_files = ("consolidated.00.pth",)
    format_name = "meta"

    def __init__(
        self,
        checkpoint_dir: str | Path,
        checkpoint_files: list[str] | Mapping[str, Any] | None = None,
        model_type: str | None = None,
        output_dir: str | Path | None = None,
        adapter_checkpoint: str | Path | None = None,
        recipe_checkpoint: str | Path | None = None,
        resume_from_checkpoint: bool = False,
        should_load_recipe_state: bool = False,
        safe_serialization: bool = True,
        keep_last_n_checkpoints: int | None = None,
        save_adapter_weights_only: bool = False,
    ) -> None:
        # torchtune's positional order for this format (no safe_serialization before should_load_recipe_state)
        super().__init__(
            checkpoint_dir,
            checkpoint_files,
            model_type,
            output_dir,
            adapter_checkpoint=adapter_checkpoint,
            recipe_checkpoint=recipe_checkpoint,
            resume_from_checkpoint=resume_from_checkpoint,
            safe_serialization=safe_serialization,
            should_load_recipe_state=should_load_recipe_state,
            keep_last_n_checkpoints=keep_last_n_checkpoints,
            save_adapter_weights_only=save_adapter_weights_only,
        )

    def _setup_format(self) -> None:
        self._safe_serialization = False  # the format is a torch.save file by definition
        if len(self._files) != 1:
            raise ValueError(
                f"FullModelMetaCheckpointer reads one consolidated file, got {len(self._files)}: "
                f"{[p.name for p in self._files]}. Model-parallel shards must be merged first."
            )
        params_path = self._checkpoint_dir / "params.json"
        if not params_path.is_file():
            raise CheckpointError(
                missing_files_error(self._checkpoint_dir, ["params.json"], "Meta's model description")
            )
        params = read_json(params_path, "Meta's model description")
        self._num_heads = int(params["n_heads"])
        self._num_kv_heads = int(params.get("n_kv_heads") or params["n_heads"])
        dim = int(params["dim"])
        # What the family's HF converter may read; Meta's own names translated.
        self._config = {
            "model_type": "llama",
            "hidden_size": dim,
            "num_attention_heads": self._num_heads,
            "num_key_value_heads": self._num_kv_heads,
            "head_dim": dim // self._num_heads,
            "num_hidden_layers": params.get("n_layers"),
            "vocab_size": params.get("vocab_size"),
            "rms_norm_eps": params.get("norm_eps"),
            "tie_word_embeddings": False,
        }

    def _to_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hf = meta_to_hf(state_dict, self._num_heads, self._num_kv_heads)
        return self._converter("hf_to_tune")(hf, self._config)

    def _from_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hf = self._converter("tune_to_hf")(state_dict, self._config)
        return hf_to_meta(hf, self._num_heads, self._num_kv_heads)


class FullModelTorchTuneCheckpointer(_Checkpointer):
    """Reads and writes tune's own format: tune's state-dict keys, no conversion, in safetensors (or
    ``.pt``/``.bin`` read with ``weights_only=True``).

    ``model_type`` is optional; when given (and the directory has a ``config.json``), adapters are written in the
    PEFT format, otherwise with tune's keys.

    Args:
        checkpoint_dir (str | Path): the directory with the weights.
        checkpoint_files (list[str] | Mapping | None): weight files; default every ``*.safetensors`` file.
        model_type (str | None): the model family, for PEFT adapters. Default None.
        output_dir (str | Path): where checkpoints go.
        adapter_checkpoint (str | Path | None): as for :class:`FullModelHFCheckpointer`.
        recipe_checkpoint (str | Path | None): as for :class:`FullModelHFCheckpointer`.
        resume_from_checkpoint (bool): as for :class:`FullModelHFCheckpointer`.
        should_load_recipe_state (bool): as for :class:`FullModelHFCheckpointer`.
        safe_serialization (bool): write safetensors (True) or ``.pt``-style pickles of tensors. Default True.
        keep_last_n_checkpoints (int | None): as for :class:`FullModelHFCheckpointer`.
        save_adapter_weights_only (bool): as for :class:`FullModelHFCheckpointer`.
    """

    _needs_family = False
    format_name = "tune"

    def __init__(
        self,
        checkpoint_dir: str | Path,
        checkpoint_files: list[str] | Mapping[str, Any] | None = None,
        model_type: str | None = None,
        output_dir: str | Path | None = None,
        adapter_checkpoint: str | Path | None = None,
        recipe_checkpoint: str | Path | None = None,
        resume_from_checkpoint: bool = False,
        should_load_recipe_state: bool = False,
        safe_serialization: bool = True,
        keep_last_n_checkpoints: int | None = None,
        save_adapter_weights_only: bool = False,
    ) -> None:
        # torchtune's positional order for this format (no safe_serialization before should_load_recipe_state)
        super().__init__(
            checkpoint_dir,
            checkpoint_files,
            model_type,
            output_dir,
            adapter_checkpoint=adapter_checkpoint,
            recipe_checkpoint=recipe_checkpoint,
            resume_from_checkpoint=resume_from_checkpoint,
            safe_serialization=safe_serialization,
            should_load_recipe_state=should_load_recipe_state,
            keep_last_n_checkpoints=keep_last_n_checkpoints,
            save_adapter_weights_only=save_adapter_weights_only,
        )

    def _setup_format(self) -> None:
        config_path = self._checkpoint_dir / "config.json"
        self._config = read_json(config_path, "The model config") if config_path.is_file() else {}
        self._model_family = self._family  # kept for torchtune's layout even when adapters keep tune's keys
        if not self._config:
            self._family = None  # without config.json no HF names can be derived: adapters keep tune's keys
        # set when the weights read are in torchtune's layout: (tune key -> torchtune key, q/k head counts or None)
        self._torchtune_layout: tuple[dict[str, str], tuple[int, int] | None] | None = None

    def _to_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        layout = self._model_family.torchtune_layout if self._model_family is not None else None
        self._torchtune_layout = None
        if layout is None or not is_torchtune_layout(state_dict):
            if self._model_family is None and is_torchtune_layout(state_dict):
                log.warning(
                    "The weights have parameters named `scale`, as torchtune names its norms: if torchtune wrote them, "
                    "set `checkpointer.model_type` (e.g. LLAMA3_2) so that they are converted to tune's layout."
                )
            return state_dict
        heads = self._torchtune_rope_heads(state_dict) if layout.interleaved_rope else None
        converted = torchtune_to_tune(state_dict, heads, renames=layout.key_renames)
        renamed = {new: old for new, old in zip(converted, state_dict) if new != old}
        self._torchtune_layout = (renamed, heads)
        log.info(
            "The weights read are in torchtune's layout (norms' `scale`"
            + (", q/k rows in interleaved RoPE order" if heads else "")
            + "): converted to tune's on load, and written back in torchtune's layout."
        )
        return converted

    def _from_tune(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._torchtune_layout is None:
            return dict(state_dict)
        renamed, heads = self._torchtune_layout
        return tune_to_torchtune(state_dict, heads, renamed)

    def _adapter_to_tune(self, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._torchtune_layout is None:
            return adapter
        return torchtune_to_tune(adapter, self._torchtune_layout[1])

    def _adapter_from_tune(self, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._torchtune_layout is None:
            return adapter
        return tune_to_torchtune(adapter, self._torchtune_layout[1], {})

    def _torchtune_rope_heads(self, state_dict: Mapping[str, torch.Tensor]) -> tuple[int, int]:
        """(num_heads, num_kv_heads) to undo torchtune's interleaved q/k rows."""
        family = self._model_family
        where = self._files[0].parent
        if self._config.get("num_attention_heads"):
            num_heads = int(self._config["num_attention_heads"])
            return num_heads, int(self._config.get("num_key_value_heads") or num_heads)
        params_path = self._checkpoint_dir / "params.json"
        if params_path.is_file():
            params = read_json(params_path, "Meta's model description")
            return int(params["n_heads"]), int(params.get("n_kv_heads") or params["n_heads"])
        heads = _heads_from_sizes(family, state_dict)
        if heads is None:
            raise CheckpointError(
                f"{where} holds {family.name} weights in torchtune's layout, whose q/k rows tune reorders for its "
                "RoPE layout; that needs the head counts, and the shapes match no released size of the family. Put "
                f"the model's Hugging Face config.json (num_attention_heads, num_key_value_heads) in {where}."
            )
        return heads


def _heads_from_sizes(family: ModelFamily, state_dict: Mapping[str, torch.Tensor]) -> tuple[int, int] | None:
    """The head counts of the family's released size whose dimensions the weights have; None if none or ambiguous."""
    q, k = state_dict.get("layers.0.attn.q_proj.weight"), state_dict.get("layers.0.attn.k_proj.weight")
    embed = state_dict.get("tok_embeddings.weight")
    if q is None or k is None or embed is None:
        return None
    num_layers = len({key.split(".")[1] for key in state_dict if key.startswith("layers.")})
    found = set()
    for size in family.sizes.values():
        dims = size.dims
        head_dim = dims.get("head_dim") or dims["embed_dim"] // dims["num_heads"]
        num_kv_heads = dims.get("num_kv_heads") or dims["num_heads"]
        if (
            tuple(embed.shape) == (dims["vocab_size"], dims["embed_dim"])
            and dims["num_layers"] == num_layers
            and q.shape[0] == dims["num_heads"] * head_dim
            and k.shape[0] == num_kv_heads * head_dim
        ):
            found.add((int(dims["num_heads"]), int(num_kv_heads)))
    return found.pop() if len(found) == 1 else None


# torchtune defines DistributedCheckpointer in this module; code importing it from here keeps working
from tune.training.checkpointing._distributed import DistributedCheckpointer  # noqa: E402, F401
