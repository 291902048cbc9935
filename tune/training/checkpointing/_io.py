"""Safe reading and writing of weight files: safetensors (memory-mapped) or ``torch.load(weights_only=True)``.

Nothing here unpickles arbitrary objects: a pickle that carries code is refused with an error naming the file.
"""

import json
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from tune.training.checkpointing._constants import DOWNLOAD_RECORD_FILE
from tune.utils import TuneError, read_json_file


class CheckpointError(TuneError, ValueError):
    """A checkpoint file (weights, index, config, recipe state) that is missing, corrupt, unsafe or does not fit
    the run; the message names the file. The CLI prints it as one ``error:`` line."""


class CheckpointSaveError(TuneError, OSError):
    """Writing a checkpoint failed (a full disk, a file-size limit, no permission); the message names the output
    directory and the previous complete checkpoint, which the failed save left as it was."""


# Extensions of the weight files the checkpointers read.
SAFETENSORS_SUFFIX = ".safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Loads a safetensors file as CPU tensors backed by a copy-on-write memory map of the file.

    Pages are read from disk only when a tensor is used, so loading a checkpoint costs about its size in
    resident memory at most (and less when tensors are moved to a device one at a time).

    Args:
        path (str | Path): the ``.safetensors`` file.

    Returns:
        dict[str, torch.Tensor]: tensors by key, in the file's order.

    Raises:
        CheckpointError: if the file is not valid safetensors (corrupt or truncated), naming it.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, RuntimeError) as error:
        raise CheckpointError(
            f"Could not read the safetensors file {path}: {error}. The file is corrupt or truncated (an interrupted "
            "download or copy); delete it and download or copy it again."
        ) from error


def read_safetensors_shapes(path: str | Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Reads only the header of a safetensors file: dtype and shape of each tensor, no data.

    Args:
        path (str | Path): the ``.safetensors`` file.

    Returns:
        dict[str, tuple[torch.dtype, tuple[int, ...]]]: ``(dtype, shape)`` by key.

    Raises:
        CheckpointError: if the header cannot be read, naming the file.
    """
    from safetensors import SafetensorError, safe_open

    shapes = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                tensor_slice = handle.get_slice(key)
                shapes[key] = (_SAFETENSORS_DTYPES[tensor_slice.get_dtype()], tuple(tensor_slice.get_shape()))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(
            f"Could not read the safetensors header of {path}: {error}. The file is corrupt."
        ) from error
    return shapes


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def safe_torch_load(path: str | Path, *, mmap: bool = True) -> Any:
    """``torch.load`` restricted to tensors and plain containers (``weights_only=True``), memory-mapped.

    Args:
        path (str | Path): a file written by ``torch.save``.
        mmap (bool): memory-map tensor storages instead of reading them into memory. Default True.

    Returns:
        Any: the loaded object (dicts, lists, tuples, numbers, strings, tensors).

    Raises:
        CheckpointError: if the file holds anything else (a pickle carrying code, a custom class), or is corrupt or
            truncated; the message names the file.
    """
    try:
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as error:
            if not (mmap and "zipfile" in str(error)):
                raise
            # Files from torch < 1.6 (legacy format) cannot be memory-mapped: read them whole.
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=False)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"Refused to load {path}: it holds objects other than tensors and plain containers, and tune never "
            "unpickles arbitrary objects (a pickle can run code). Convert the file to safetensors with a trusted "
            f"tool, or re-save only its tensors. Details: {str(error).splitlines()[0]}"
        ) from error
    except (RuntimeError, EOFError, OSError) as error:
        raise CheckpointError(
            f"Could not read {path}: {error}. The file is corrupt or truncated (an interrupted download or save); "
            "delete it and download or save it again."
        ) from error


def load_weights_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Loads a weights file by extension: safetensors, or ``.bin``/``.pt``/``.pth`` with ``weights_only=True``.

    Args:
        path (str | Path): the file.

    Returns:
        dict[str, torch.Tensor]: the state dict.

    Raises:
        CheckpointError: for an unknown extension, unsafe content, or a corrupt file.
    """
    path = Path(path)
    if path.suffix == SAFETENSORS_SUFFIX:
        return load_safetensors(path)
    if path.suffix in PICKLE_SUFFIXES:
        state = safe_torch_load(path)
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{path} holds a {type(state).__name__}, expected a dict of tensors (a state dict).")
        return dict(state)
    raise CheckpointError(
        f"Unsupported weights file {path}: expected one of {SAFETENSORS_SUFFIX}, {', '.join(PICKLE_SUFFIXES)}."
    )


def load_tensors(path: str | Path, keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """Reads some tensors of a weights file: from safetensors only those (the rest of the file is not read), from
    ``.bin``/``.pt``/``.pth`` the file memory-mapped with ``weights_only=True`` and those picked out.

    Args:
        path (str | Path): the file.
        keys (Iterable[str]): the tensors to read.

    Returns:
        dict[str, torch.Tensor]: the tensors by key, in their dtype in the file.

    Raises:
        CheckpointError: for a key the file does not hold (it changed since it was read), or an unreadable file;
            naming the file.
    """
    from safetensors import SafetensorError, safe_open

    path, keys = Path(path), list(keys)
    if path.suffix == SAFETENSORS_SUFFIX:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                present = set(handle.keys())
                found = {key: handle.get_tensor(key) for key in keys if key in present}
        except (SafetensorError, OSError, RuntimeError) as error:
            raise CheckpointError(
                f"Could not read the safetensors file {path}: {error}. The file is corrupt or truncated; download or "
                "copy it again."
            ) from error
    else:
        state = load_weights_file(path)
        found = {key: state[key] for key in keys if key in state}
    missing = [key for key in keys if key not in found]
    if missing:
        raise CheckpointError(
            f"{path} no longer holds {missing[:3]}{' ...' if len(missing) > 3 else ''} ({len(missing)} tensor(s)), "
            "which it held when the run started: the checkpoint directory was changed during the run. Restore the "
            "original files."
        )
    return found


def _dedupe_storages(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors sharing memory (tied embeddings) and non-contiguous views: give each its own.
    seen: set[tuple[int, int]] = set()
    out = {}
    for key, tensor in state_dict.items():
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if ident in seen or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        seen.add(ident)
        out[key] = tensor
    return out


def save_safetensors(state_dict: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """Writes ``state_dict`` to ``path`` in safetensors format and flushes it to disk.

    Args:
        state_dict (Mapping[str, torch.Tensor]): tensors by key (any device; tied tensors are written twice).
        path (str | Path): the file to write.

    Raises:
        OSError: when the file cannot be written (a full disk, say), naming it.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors = _dedupe_storages(state_dict)
    try:
        # transformers refuses safetensors files without the "format" metadata.
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as error:  # the Rust writer reports I/O errors (EFBIG, ENOSPC) as its own type
        raise OSError(f"could not write {path}: {error}") from error
    fsync_file(path)


def save_torch(obj: Any, path: str | Path) -> None:
    """``torch.save`` followed by an fsync, so a later rename publishes complete data.

    Args:
        obj (Any): tensors and plain containers only (so :func:`safe_torch_load` can read it back).
        path (str | Path): the file to write.

    Raises:
        OSError: when the file cannot be written (a full disk, say), naming it.
    """
    try:
        torch.save(obj, str(path))
    except RuntimeError as error:  # the zip writer reports a failed write (full disk) as "unexpected pos ..."
        raise OSError(f"could not write {path}: {error}") from error
    fsync_file(path)


def save_json(obj: Any, path: str | Path) -> None:
    """Writes ``obj`` as indented JSON and flushes it to disk.

    Args:
        obj (Any): JSON-serialisable data.
        path (str | Path): the file to write.
    """
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    fsync_file(path)


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Reads a JSON file of a checkpoint (config.json, an index, adapter_config.json, params.json).

    Args:
        path (str | Path): the file.
        what (str): what the file is, for the message.

    Returns:
        Any: the parsed JSON.

    Raises:
        CheckpointError: when the file cannot be read or is not valid JSON, naming it and the line.
    """
    return read_json_file(
        path, what, error=CheckpointError, fix="the file is corrupt or truncated; download or copy it again"
    )


def fsync_file(path: str | Path) -> None:
    """Flushes a file's data to disk."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flushes a directory entry (a rename inside it) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe_dir(path: str | Path, limit: int = 30) -> str:
    """A short listing of a directory's entries for error messages."""
    path = Path(path)
    if not path.is_dir():
        return "(the directory does not exist)"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not names:
        return "(the directory is empty)"
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def download_hint(checkpoint_dir: str | Path) -> str:
    """The ``tune download`` command that would fetch a model into ``checkpoint_dir``."""
    checkpoint_dir = Path(checkpoint_dir)
    repo_id = "<hf_repo_id>"
    record = checkpoint_dir / DOWNLOAD_RECORD_FILE
    if record.is_file():
        try:
            repo_id = json.loads(record.read_text()).get("repo_id") or repo_id
        except (ValueError, OSError):
            pass
    return f"tune download {repo_id} --output-dir {checkpoint_dir}"


def missing_files_error(checkpoint_dir: str | Path, missing: Iterable[str], what: str = "Checkpoint files") -> str:
    """The message for checkpoint files that are not where they should be."""
    return (
        f"{what} not found in {checkpoint_dir}: {', '.join(missing)}. The directory holds: "
        f"{describe_dir(checkpoint_dir)}. Check `checkpoint_dir` and `checkpoint_files`, or fetch the model with "
        f"`{download_hint(checkpoint_dir)}`."
    )
