"""Recipe state beyond the weights: RNG states, the resolved config, ``recipe_state.pt``."""

import os
import random
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tune.training.checkpointing._constants import CONFIG_FILE
from tune.training.checkpointing._io import CheckpointError, safe_torch_load, save_torch


def get_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global random generators (CPU and every CUDA device).

    Everything is stored as tensors and plain containers, so ``torch.load(weights_only=True)`` reads it back.

    Returns:
        dict[str, Any]: keys ``python``, ``numpy``, ``torch`` and, where CUDA is initialised, ``cuda``.
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restores the generator states captured by :func:`get_rng_state`.

    Args:
        state (Mapping[str, Any]): the dict :func:`get_rng_state` returned (possibly saved and loaded).

    Raises:
        ValueError: if a key is missing.
    """
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(f"RNG state lacks {sorted(missing)}; expected the dict returned by get_rng_state().")
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain(value: Any) -> Any:
    # Turns any mapping (a dict, an OmegaConf DictConfig: its values resolve as they are read) into plain data.
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def config_to_yaml(config: Mapping[str, Any] | str) -> str:
    """Renders a resolved config as YAML.

    Args:
        config (Mapping[str, Any] | str): a dict, any mapping (such as an OmegaConf ``DictConfig``, whose
            interpolations are resolved as it is read), or YAML text (returned unchanged).

    Returns:
        str: the YAML text.

    Raises:
        TypeError: for anything else.
    """
    if isinstance(config, str):
        return config if config.endswith("\n") else config + "\n"
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (dict or DictConfig) or YAML text, got {type(config).__name__}.")
    import yaml

    return yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False)


def save_config(config: Mapping[str, Any] | str, directory: str | Path) -> Path:
    """Writes the resolved config as ``config.yaml`` in ``directory``, atomically (see :func:`write_text_atomically`).

    The one writer of ``config.yaml``: the checkpointers call it for the copy inside each checkpoint, and
    :func:`tune.config.save_config` for the one in ``output_dir``.

    Args:
        config (Mapping[str, Any] | str): see :func:`config_to_yaml`.
        directory (str | Path): where to write it (an existing directory).

    Returns:
        Path: the file written.

    Raises:
        TypeError: for a config that is neither a mapping nor YAML text.
        OSError: when the file cannot be written (a full disk, say), naming it; a ``config.yaml`` already there is
            left as it was.
    """
    path = Path(directory) / CONFIG_FILE
    write_text_atomically(config_to_yaml(config), path)
    return path


def write_text_atomically(text: str, path: str | Path) -> None:
    """Writes ``text`` (UTF-8) to ``path`` so that ``path`` holds either its old content or all of the new.

    The text goes into a temporary file beside ``path``, is flushed to disk, and the file is renamed over ``path``.

    Args:
        text (str): the content.
        path (str | Path): the file to write; its directory must exist.

    Raises:
        OSError: when the file cannot be written (a full disk, a file-size limit, no permission), naming it; the
            temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    temp = None
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException as error:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OSError(f"could not write {path}: {error}") from error
        raise


def save_recipe_state(state: Mapping[str, Any], path: str | Path) -> None:
    """Writes the recipe state (optimizer, LR scheduler, progress, data-loader position, RNG states).

    Args:
        state (Mapping[str, Any]): tensors and plain containers only.
        path (str | Path): the ``recipe_state.pt`` file to write.

    Raises:
        TypeError: naming the first value that :func:`load_recipe_state` could not read back.
    """
    _check_plain(state, "recipe_state")
    save_torch(dict(state), path)


def load_recipe_state(path: str | Path, required: Collection[str] = ()) -> dict[str, Any]:
    """Reads ``recipe_state.pt`` with ``weights_only=True`` (tensors and plain containers only).

    Args:
        path (str | Path): the file.
        required (Collection[str]): keys the state must hold (the checkpointer asks for the RNG states it always
            writes, so a file another program or an incompatible version wrote is refused). Default none.

    Returns:
        dict[str, Any]: the recipe state.

    Raises:
        CheckpointError: if the file is missing, corrupt, holds other objects, or lacks a required key; the
            message names the file.
    """
    if not Path(path).is_file():
        raise CheckpointError(
            f"Recipe state {path} does not exist; the checkpoint cannot be resumed. Point `recipe_checkpoint` at "
            "the recipe_state.pt of the run, or set `resume_from_checkpoint: false` to start a new run."
        )
    state = safe_torch_load(path, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, expected the recipe-state dict.")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(
            f"{path} is not a recipe state this version of tune wrote: it lacks {missing} (it holds "
            f"{sorted(map(str, state))[:8]}). It comes from another program or an incompatible run; set "
            "`resume_from_checkpoint: false` to start a new run, or point `output_dir` at a run tune saved."
        )
    return state


_PLAIN_TYPES = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


def _check_plain(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple, set)):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
    elif not isinstance(value, _PLAIN_TYPES):
        raise TypeError(
            f"{where} is a {type(value).__module__}.{type(value).__name__}, which the checkpoint cannot store: "
            "recipe state is read back with torch.load(weights_only=True), so it may hold only tensors, numbers, "
            "strings and dicts/lists/tuples of them. Save its state_dict() or plain values instead."
        )
