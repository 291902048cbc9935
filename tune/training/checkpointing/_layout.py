"""Where checkpoints go and how they are published: ``output_dir/step_N/`` or ``output_dir/epoch_N/``.

A checkpoint is written into a hidden temporary directory next to its final place, completed with a
``.complete`` marker (JSON describing it), flushed to disk and renamed. A directory without the marker is never
used, so a crash during a save leaves the previous checkpoints as they were.
"""

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tune.training.checkpointing._constants import COMPLETE_MARKER, CONFIG_FILE
from tune.training.checkpointing._io import CheckpointSaveError, fsync_dir, save_json
from tune.utils import get_logger

log = get_logger(name=__name__)

_CHECKPOINT_NAME = re.compile(r"^(step|epoch)_(\d+)$")
_TEMP_PREFIX = ".tmp_"
_OLD_PREFIX = ".old_"
_ASIDE_PREFIX = "overwritten_"
# subdirectories of output_dir holding checkpoints of their own: the sharded states of distributed runs
# (tune.training.DCP_SUBDIR)
_CHECKPOINT_SUBDIRS = ("dcp",)
# what a metric logger writes before the first step (tune.training.DiskLogger.log_config): no sign of a run
_LOG_DIR_SETUP_FILES = frozenset({"config.json"})


def checkpoint_dir_name(epoch: int | None = None, step: int | None = None) -> str:
    """The directory name of a checkpoint: ``step_{step}`` when a step is given, else ``epoch_{epoch}``.

    Args:
        epoch (int | None): epochs completed.
        step (int | None): global optimizer steps completed.

    Returns:
        str: ``"step_N"`` or ``"epoch_N"``.

    Raises:
        ValueError: if neither is given or one is negative.
    """
    if step is None and epoch is None:
        raise ValueError("save_checkpoint needs `epoch` or `step` to name the checkpoint directory; got neither.")
    value, kind = (step, "step") if step is not None else (epoch, "epoch")
    if int(value) < 0:
        raise ValueError(f"{kind} must be >= 0 to name a checkpoint, got {value}.")
    return f"{kind}_{int(value)}"


def should_save_checkpoint(global_step: int, save_every_n_steps: int | None) -> bool:
    """Whether a recipe saves an intermediate checkpoint after optimizer step ``global_step``.

    Args:
        global_step (int): optimizer steps completed so far (1 after the first step).
        save_every_n_steps (int | None): the ``save_every_n_steps`` config key; ``None`` saves at epoch ends only.

    Returns:
        bool: True every ``save_every_n_steps`` steps.

    Raises:
        ValueError: if ``save_every_n_steps`` is not a positive integer or None.
    """
    if save_every_n_steps is None:
        return False
    if isinstance(save_every_n_steps, bool) or not isinstance(save_every_n_steps, int) or save_every_n_steps <= 0:
        raise ValueError(
            f"save_every_n_steps must be a positive integer or null, got {save_every_n_steps!r}. "
            "Set `save_every_n_steps: null` to save only at the end of each epoch."
        )
    return global_step > 0 and global_step % save_every_n_steps == 0


def read_marker(checkpoint_path: str | Path) -> dict[str, Any] | None:
    """The ``.complete`` marker of a checkpoint directory, or None when the checkpoint is incomplete.

    Args:
        checkpoint_path (str | Path): a ``step_N``/``epoch_N`` directory.

    Returns:
        dict | None: the marker's content.
    """
    marker = Path(checkpoint_path) / COMPLETE_MARKER
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


def list_complete_checkpoints(output_dir: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every complete checkpoint in ``output_dir``, oldest first.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.

    Returns:
        list[tuple[Path, dict]]: ``(directory, marker)`` pairs ordered by the time they were saved.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for path in output_dir.iterdir():
        if path.is_dir() and _CHECKPOINT_NAME.match(path.name):
            marker = read_marker(path)
            if marker is not None:
                found.append((path, marker))
    # saved_at orders checkpoints of one run; the step breaks ties of equal timestamps (coarse clocks).
    found.sort(key=lambda item: (item[1].get("saved_at", 0), item[1].get("global_step") or -1))
    return found


def find_latest_checkpoint(
    output_dir: str | Path, *, require_recipe_state: bool = True, format_name: str | None = None
) -> Path | None:
    """The newest complete checkpoint in ``output_dir`` (what ``resume_from_checkpoint: true`` resumes from).

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
        require_recipe_state (bool): consider only checkpoints holding ``recipe_state.pt`` (intermediate ones, that
            a run can resume from). Default True.
        format_name (str | None): consider only checkpoints written in this format (``"hf"``, ``"meta"``,
            ``"tune"``, ``"dcp"``). Default None (any).

    Returns:
        Path | None: its directory, or None when there is none.
    """
    candidates = [
        path
        for path, marker in list_complete_checkpoints(output_dir)
        if (marker.get("recipe_state") or not require_recipe_state)
        and (format_name is None or marker.get("format") == format_name)
    ]
    return candidates[-1] if candidates else None


def prune_checkpoints(output_dir: str | Path, keep_last_n: int | None) -> list[Path]:
    """Deletes all but the newest ``keep_last_n`` complete checkpoints.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
        keep_last_n (int | None): how many to keep; None keeps all.

    Returns:
        list[Path]: the directories removed.

    Raises:
        ValueError: if ``keep_last_n`` is not a positive integer or None.
    """
    if keep_last_n is None:
        return []
    if isinstance(keep_last_n, bool) or not isinstance(keep_last_n, int) or keep_last_n <= 0:
        raise ValueError(f"keep_last_n_checkpoints must be a positive integer or null (keep all), got {keep_last_n!r}.")
    complete = list_complete_checkpoints(output_dir)
    removed = [path for path, _ in complete[: max(0, len(complete) - keep_last_n)]]
    for path in removed:
        # Unpublish first (rename is atomic), so a crash mid-delete never leaves a half checkpoint that looks whole.
        doomed = path.with_name(f"{_OLD_PREFIX}{path.name}_{os.getpid()}")
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        log.info(f"Removed old checkpoint {path} (keep_last_n_checkpoints={keep_last_n}).")
    return removed


def find_earlier_run(
    output_dir: str | Path, log_dirs: Iterable[str | Path] = (), checkpoint_dirs: Iterable[str | Path] = ()
) -> list[Path]:
    """What in ``output_dir`` shows that a run already trained there.

    That is: every complete checkpoint (``step_N``/``epoch_N`` with its ``.complete`` marker, and those under
    ``dcp/``, the sharded states of distributed runs), the run's ``config.yaml`` (written once a run has set up and
    loaded its weights), and each of ``log_dirs`` inside ``output_dir`` holding a non-empty file other than the
    metric logger's ``config.json``. An empty or missing ``output_dir``, incomplete checkpoints and a log directory
    with only empty files (a run that failed while loading) are not an earlier run.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
        log_dirs (Iterable[str | Path]): the metric loggers' directories; those outside ``output_dir`` are not
            looked at (logs of several runs may share a directory on purpose).
        checkpoint_dirs (Iterable[str | Path]): where other checkpointers of the run write (a PPO value model's
            ``output_dir/value``, say); those inside ``output_dir`` are looked at like ``output_dir`` itself.

    Returns:
        list[Path]: what was found, checkpoints oldest first, then ``config.yaml``, then log directories; empty
        when the directory is free for a new run.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for directory in _checkpoint_roots(output_dir, checkpoint_dirs):
        for place in (directory, *(directory / subdir for subdir in _CHECKPOINT_SUBDIRS)):
            found += [path for path, _ in list_complete_checkpoints(place)]
    if (output_dir / CONFIG_FILE).is_file():
        found.append(output_dir / CONFIG_FILE)
    for log_dir in dict.fromkeys(Path(d) for d in log_dirs):
        found += _log_entries(log_dir, output_dir)
    return found


def move_earlier_run_aside(
    output_dir: str | Path, log_dirs: Iterable[str | Path] = (), checkpoint_dirs: Iterable[str | Path] = ()
) -> Path | None:
    """Moves an earlier run's outputs (see :func:`find_earlier_run`) into ``output_dir/overwritten_<time>/``.

    Every ``step_N``/``epoch_N`` directory (complete or not), ``dcp/``, ``config.yaml`` and the log directories inside
    ``output_dir`` are renamed there, keeping their paths relative to ``output_dir``, so a new run starts from an
    empty layout and nothing of the earlier one is deleted.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
        log_dirs (Iterable[str | Path]): the metric loggers' directories (those outside ``output_dir`` stay).
        checkpoint_dirs (Iterable[str | Path]): where other checkpointers of the run write; the checkpoints of
            those inside ``output_dir`` are moved too.

    Returns:
        Path | None: the directory now holding the earlier run, or None when there was nothing to move.
    """
    output_dir = Path(output_dir)
    log_dirs, checkpoint_dirs = [Path(d) for d in log_dirs], [Path(d) for d in checkpoint_dirs]
    if not find_earlier_run(output_dir, log_dirs, checkpoint_dirs):
        return None
    moved = []
    for directory in _checkpoint_roots(output_dir, checkpoint_dirs):
        moved += [p for p in directory.iterdir() if p.is_dir() and _CHECKPOINT_NAME.match(p.name)]
        moved += [directory / subdir for subdir in _CHECKPOINT_SUBDIRS if (directory / subdir).is_dir()]
    moved += [output_dir / CONFIG_FILE] if (output_dir / CONFIG_FILE).is_file() else []
    moved += [entry for log_dir in dict.fromkeys(log_dirs) for entry in _log_entries(log_dir, output_dir, every=True)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = output_dir / f"{_ASIDE_PREFIX}{stamp}"
    number = 1
    while aside.exists():  # two overwrites within one second
        number += 1
        aside = output_dir / f"{_ASIDE_PREFIX}{stamp}_{number}"
    for path in moved:
        target = aside / path.resolve().relative_to(output_dir.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    fsync_dir(output_dir)
    return aside


def _checkpoint_roots(output_dir: Path, checkpoint_dirs: Iterable[str | Path]) -> list[Path]:
    """``output_dir`` and the existing ``checkpoint_dirs`` inside it."""
    inside = [Path(d) for d in checkpoint_dirs if Path(d).is_dir() and _is_within(Path(d), output_dir)]
    return [output_dir, *dict.fromkeys(inside)]


def _is_within(path: Path, directory: Path) -> bool:
    return directory.resolve() in path.resolve().parents


def _log_entries(log_dir: Path, output_dir: Path, every: bool = False) -> list[Path]:
    """The entries of ``output_dir`` that hold the logs of ``log_dir``: the directory itself when it lies inside
    ``output_dir``, its files when it is ``output_dir``; none when it is elsewhere or holds no logs (unless
    ``every``: all of them, written or not)."""
    if not log_dir.is_dir():
        return []
    if log_dir.resolve() == output_dir.resolve():  # logs written next to the checkpoints
        entries = [p for p in log_dir.iterdir() if p.is_file() and p.name != CONFIG_FILE]
    elif _is_within(log_dir, output_dir):
        entries = [log_dir]
    else:
        return []
    return entries if every or any(_holds_logs(entry, log_dir) for entry in entries) else []


def _holds_logs(entry: Path, log_dir: Path) -> bool:
    """Whether ``entry`` (a file or directory) holds a non-empty file other than the logger's setup files."""
    files = entry.rglob("*") if entry.is_dir() else [entry]
    for path in files:
        if path.name in _LOG_DIR_SETUP_FILES and path.parent == log_dir:
            continue
        try:
            if path.is_file() and path.stat().st_size > 0:
                return True
        except OSError:  # gone while looking (another process cleaning up)
            continue
    return False


def remove_stale_temporaries(output_dir: str | Path) -> None:
    """Removes the temporary directories that a crashed save left behind in ``output_dir``.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return
    for path in output_dir.iterdir():
        if path.is_dir() and path.name.startswith((_TEMP_PREFIX, _OLD_PREFIX)):
            log.warning(f"Removing {path}, left by an interrupted checkpoint save.")
            shutil.rmtree(path, ignore_errors=True)


def temporary_dir_for(output_dir: str | Path, name: str) -> Path:
    """The temporary directory a checkpoint named ``name`` is written into before it is published.

    The name is deterministic so that every rank of a distributed save writes into the same directory.
    """
    return Path(output_dir) / f"{_TEMP_PREFIX}{name}"


def publish_checkpoint(temp_dir: str | Path, final_dir: str | Path, marker: Mapping[str, Any]) -> Path:
    """Completes ``temp_dir`` with its marker, flushes it and renames it to ``final_dir``.

    An existing ``final_dir`` (the same step saved again) is replaced.

    Args:
        temp_dir (str | Path): the fully written temporary directory.
        final_dir (str | Path): the checkpoint's final place.
        marker (Mapping[str, Any]): what the ``.complete`` marker records (files, step, epoch, ...).

    Returns:
        Path: ``final_dir``.
    """
    temp_dir, final_dir = Path(temp_dir), Path(final_dir)
    save_json({**marker, "saved_at": time.time_ns()}, temp_dir / COMPLETE_MARKER)
    fsync_dir(temp_dir)
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f"{_OLD_PREFIX}{final_dir.name}_{os.getpid()}")
        os.replace(final_dir, old)
    os.replace(temp_dir, final_dir)
    fsync_dir(final_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final_dir


@contextmanager
def atomic_checkpoint_dir(output_dir: str | Path, name: str, marker: dict[str, Any]) -> Iterator[Path]:
    """Context manager yielding a temporary directory that becomes ``output_dir/name`` when the block succeeds.

    Fill ``marker`` inside the block (it is written as ``.complete``); on an exception the temporary directory
    is removed and nothing is published.

    Args:
        output_dir (str | Path): the recipe's ``output_dir``.
        name (str): ``step_N`` or ``epoch_N``.
        marker (dict[str, Any]): the marker content, which the block may extend.

    Yields:
        Path: the temporary directory to write into.

    Raises:
        CheckpointSaveError: when a write fails (a full disk, a file-size limit): the message names
            ``output_dir`` and the previous complete checkpoint, which stays as it was; the temporary directory is
            removed.
    """
    temp_dir = temporary_dir_for(output_dir, name)
    try:
        if temp_dir.exists():
            shutil.rmtree(temp_dir)
        temp_dir.mkdir(parents=True)
        yield temp_dir
        publish_checkpoint(temp_dir, Path(output_dir) / name, marker)
    except OSError as error:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise CheckpointSaveError(_save_failed_message(output_dir, name, error)) from error
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def _save_failed_message(output_dir: str | Path, name: str, error: OSError) -> str:
    # Checkpoints are published by a rename, so a failed save leaves the complete ones untouched.
    complete = list_complete_checkpoints(output_dir)
    if complete:
        previous = f"The previous checkpoint {complete[-1][0]} is intact"
        resumable = find_latest_checkpoint(output_dir)
        if resumable is not None:
            previous += f"; `resume_from_checkpoint=True` resumes from {resumable}"
    else:
        previous = "No earlier checkpoint was lost (there was none)"
    try:
        free = f" ({shutil.disk_usage(output_dir).free / 2**30:.1f} GiB free there)"
    except OSError:
        free = ""
    return (
        f"Could not save checkpoint {name} to output_dir {output_dir}: {error}. {previous}, and the partial "
        f"checkpoint was removed. Free disk space{free} or raise the file-size limit (`ulimit -f`), or set "
        "output_dir to another disk, then run again."
    )
