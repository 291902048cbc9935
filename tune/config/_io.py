import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tune.config._errors import ConfigError, ConfigProblem

CONFIG_FILE_NAME = "config.yaml"


def resolved_yaml(cfg: DictConfig) -> str:
    """The config as YAML with every ``${...}`` interpolation resolved.

    Raises:
        ConfigError: naming the key of an interpolation that cannot be resolved.
    """
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or ""
        raise ConfigError(ConfigProblem(key, f"cannot resolve: {str(err).splitlines()[0]}")) from None


def log_config(recipe_name: str, cfg: DictConfig) -> None:
    """Logs the resolved config at INFO level on rank 0, so a run's log says what actually ran.

    Args:
        recipe_name (str): the recipe, named in the log line.
        cfg (DictConfig): the config.

    Raises:
        ConfigError: naming the key of an interpolation that cannot be resolved.
    """
    from tune.utils import get_logger, log_rank_zero  # tune.utils imports torch: only when a recipe runs

    text = resolved_yaml(cfg)
    log_rank_zero(get_logger(name="tune.config"), f"Running {recipe_name} with resolved config:\n\n{text}")


def save_config(cfg: DictConfig, output_dir: str | Path) -> Path:
    """Writes the resolved config to ``output_dir/config.yaml`` (on rank 0 only; atomically).

    The file is written by :func:`tune.training.checkpointing.save_config`, as the copy inside each checkpoint is.

    Args:
        cfg (DictConfig): the config.
        output_dir (str | Path): created when missing.

    Returns:
        Path: the file written (or that rank 0 writes, on other ranks).

    Raises:
        ConfigError: naming the key of an interpolation that cannot be resolved.
        CheckpointSaveError: when the file cannot be written (a full disk, say), naming it; the ``config.yaml``
            written before, if any, and the checkpoints in ``output_dir`` are left as they were.
    """
    # tune.utils and tune.training import torch: only when a recipe runs
    from tune.training.checkpointing import CheckpointSaveError
    from tune.training.checkpointing import save_config as write_config
    from tune.utils import get_rank

    path = Path(output_dir) / CONFIG_FILE_NAME
    text = resolved_yaml(cfg)
    if get_rank() != 0:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_config(text, path.parent)
    except OSError as error:
        reason = error.__cause__ if isinstance(error.__cause__, OSError) else error
        raise CheckpointSaveError(
            f"Could not write the run's config {path}: {reason}. The file keeps its previous content (if any) and "
            f"the checkpoints in {path.parent} are as they were. Free disk space or raise the file-size limit "
            "(`ulimit -f`), or set output_dir to another disk, then run again."
        ) from error


def check_output_dir(cfg: DictConfig) -> Path | None:
    """Refuses to start a training run in an ``output_dir`` that holds an earlier run, unless it resumes it.

    Two runs writing into one directory would mix: the second replaces ``step_N/`` and ``config.yaml`` and adds
    to the logs. :func:`~tune.config.parse` calls this before ``recipe_main`` (before anything is loaded or
    written) for every recipe whose config has ``output_dir`` and ``resume_from_checkpoint``. An earlier run is
    what :func:`tune.training.checkpointing.find_earlier_run` finds: complete checkpoints, ``config.yaml``, or
    metric logs inside the directory (in ``output_dir`` and in ``checkpointer.output_dir``). With
    ``resume_from_checkpoint: True`` the run continues the earlier one; with ``overwrite_output_dir: True`` the
    earlier run's outputs are moved into ``output_dir/overwritten_<time>/`` (by rank 0 under torchrun; nothing is
    deleted) and a warning names that directory.

    Args:
        cfg (DictConfig): the loaded config, its optional keys filled in.

    Returns:
        Path | None: where the earlier run was moved, or None when nothing was moved.

    Raises:
        ConfigError: on ``output_dir``, when it holds an earlier run and the config neither resumes nor opts in to
            overwriting it; every rank of a distributed run raises it.
    """
    if "output_dir" not in cfg or "resume_from_checkpoint" not in cfg or _value(cfg, "resume_from_checkpoint"):
        return None
    overwrite = bool(_value(cfg, "overwrite_output_dir"))
    if overwrite and os.environ.get("RANK", "0") != "0":  # rank 0 moves the earlier run; the others never look
        return None
    from tune.training.checkpointing import find_earlier_run, move_earlier_run_aside  # imports torch: lazily

    # where the run writes: output_dir and checkpointer.output_dir (directory -> the key naming it, the first
    # when both name one); the other checkpointers' directories (a PPO value model's) count inside output_dir only
    output_dirs: dict[Path, str] = {}
    for key in ("output_dir", "checkpointer.output_dir"):
        value = _value(cfg, key)
        if isinstance(value, str) and value:
            output_dirs.setdefault(Path(value), key)
    checkpoint_dirs = [_value(cfg, f"{name}.output_dir") for name in cfg if name != "output_dir"]
    checkpoint_dirs = [Path(d) for d in checkpoint_dirs if isinstance(d, str) and d]
    log_dirs = [Path(d) for d in _log_dirs(cfg)]
    found = {d: find_earlier_run(d, log_dirs, checkpoint_dirs) for d in output_dirs}
    found = {d: paths for d, paths in found.items() if paths}
    if not found:
        return None
    if not overwrite:
        output_dir, paths = next(iter(found.items()))
        names = [os.path.relpath(p.resolve(), output_dir.resolve()) for p in paths]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise ConfigError(
            ConfigProblem(
                output_dirs[output_dir],
                f"{output_dir} holds the outputs of an earlier run ({shown}); resume that run with "
                "resume_from_checkpoint=True, choose another output_dir, or set overwrite_output_dir=True to move "
                f"the earlier run's outputs into {output_dir}/overwritten_<time>/ and start afresh.",
            )
        )
    from tune.utils import get_logger

    aside = None
    for output_dir in found:
        moved = move_earlier_run_aside(output_dir, log_dirs, checkpoint_dirs)
        if moved is not None:
            aside = moved
            get_logger(name="tune.config").warning(
                f"overwrite_output_dir=True: moved the earlier run's outputs in {output_dir} into {moved}; delete "
                "that directory once you no longer need it."
            )
    return aside


def _value(cfg: DictConfig, key: str) -> Any:
    """``cfg``'s value at the dotted ``key``, None when it is missing or cannot be resolved (other checks say why)."""
    try:
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException:
        return None


def _log_dirs(cfg: DictConfig) -> list[str]:
    """The ``log_dir`` of the metric logger (or of each, for a list of loggers)."""
    loggers = _value(cfg, "metric_logger")
    loggers = list(loggers) if isinstance(loggers, ListConfig) else [loggers]
    dirs = []
    for index, logger in enumerate(loggers):
        key = "metric_logger" if len(loggers) == 1 else f"metric_logger[{index}]"
        log_dir = _value(cfg, f"{key}.log_dir") if isinstance(logger, DictConfig) else None
        if isinstance(log_dir, str) and log_dir:
            dirs.append(log_dir)
    return dirs
