from pathlib import Path

from omegaconf import DictConfig, OmegaConf
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
