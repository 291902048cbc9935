import importlib
import re
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tune.config._errors import ConfigError, ConfigProblem
from tune.config._instantiate import _ensure_cwd_importable

IMPORTS_KEY = "imports"
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MAKE_IMPORTABLE = (
    "make it importable: install its package, add the folder that holds it to PYTHONPATH, or run from that "
    "folder (the working directory is importable)"
)


def import_modules(cfg: DictConfig) -> list[str]:
    """Imports the modules a config lists under its top-level ``imports:`` key, in order.

    User code registers what configs then name (a model family with ``tune.registry.register_model_family``,
    datasets, model converters) when its module is imported; ``imports:`` does that before anything is
    instantiated, without packaging the code as a plugin::

        imports: [my_project.components]      # runs my_project/components.py once

    ``tune run`` (through :func:`tune.config.parse`) and ``tune validate`` call this. The working directory is
    importable, as for ``_component_`` paths.

    Args:
        cfg (DictConfig): the loaded config (overrides applied).

    Returns:
        list[str]: the module names listed (empty when the config has no ``imports:``).

    Raises:
        ConfigError: listing every entry that is not a module name, cannot be found, or fails while it is
            imported (the error of the module itself is chained, shown with ``TUNE_DEBUG=1``).
    """
    names = _listed_modules(cfg)
    if not names:
        return []
    _ensure_cwd_importable()
    problems, first_error = [], None
    for i, name in enumerate(names):
        key = f"{IMPORTS_KEY}[{i}]"
        if not isinstance(name, str) or not _MODULE_NAME.match(name):
            problems.append(ConfigProblem(key, "must be a dotted module name such as my_project.components", name))
            continue
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any failure of user code is reported against its key
            problems.append(ConfigProblem(key, _import_failure(name, err), name))
            first_error = first_error or err
    if problems:
        raise ConfigError(problems) from first_error
    return names


def _listed_modules(cfg: DictConfig) -> list[Any]:
    if cfg._get_node(IMPORTS_KEY) is None:
        return []
    try:
        value = OmegaConf.select(cfg, IMPORTS_KEY, throw_on_missing=True)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(ConfigProblem(IMPORTS_KEY, f"cannot resolve: {str(err).splitlines()[0]}")) from None
    if value is None:
        return []
    if isinstance(value, str):
        return [value]  # `imports: my_project.components`, one module
    if not isinstance(value, list):
        raise ConfigError(
            ConfigProblem(IMPORTS_KEY, "must be a list of module names, e.g. imports: [my_project.components]", value)
        )
    return value


def _import_failure(name: str, err: Exception) -> str:
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing is not None and (name == missing or name.startswith(missing + ".")):
        return f"cannot import the module: there is no module named {missing!r}; {_MAKE_IMPORTABLE}"
    # the module exists but raised (a bug in it, or a dependency of its own that is missing)
    return f"importing the module failed: {type(err).__name__}: {err}"
