import os
import tempfile
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
    log_rank_zero(get_logger("tune.config"), f"Running {recipe_name} with resolved config:\n\n{text}")


def save_config(cfg: DictConfig, output_dir: str | Path) -> Path:
    """Writes the resolved config to ``output_dir/config.yaml`` (on rank 0 only; atomically).

    Args:
        cfg (DictConfig): the config.
        output_dir (str | Path): created when missing.

    Returns:
        Path: the file written (or that rank 0 writes, on other ranks).

    Raises:
        ConfigError: naming the key of an interpolation that cannot be resolved.
    """
    from tune.utils import get_rank

    path = Path(output_dir) / CONFIG_FILE_NAME
    text = resolved_yaml(cfg)
    if get_rank() != 0:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # write then rename: a crash never leaves a half-written config next to a checkpoint
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config.", suffix=".yaml.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
