"""Finds the recipes and configs shipped with tune or added by plugins: read from the files, never a kept list.

In a source checkout (or an editable install) they are the ``recipes/`` and ``configs/`` folders next to the
``tune`` package; in an installed wheel they are ``tune/_shipped/recipes`` and ``tune/_shipped/configs``.
A recipe names the configs it runs, and whether it supports distributed runs, in its own file::

    RECIPE_INFO = {"supports_distributed": False, "configs": ["*/*_lora_single_device"]}

``configs`` are ``fnmatch`` patterns over config names (paths below ``configs/`` without ``.yaml``). The file
is read with ``ast``; a recipe is never imported to list it.
"""

import ast
import copy
import difflib
import fnmatch
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tune import plugins
from tune.config._errors import ConfigError, RecipeError
from tune.config._files import file_version

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_INFO_NAME = "RECIPE_INFO"
_INFO_KEYS = {"supports_distributed": bool, "configs": list, "optional_keys": list}
# torchtune's quantisation-aware-training recipes -> the recipe that runs their configs here. QAT is a model
# converter in tune (`model_converters:`), and a torchtune `quantizer:` entry is read as one (tune/config/_load.py).
RECIPE_ALIASES = {
    "qat_distributed": "full_finetune_distributed",
    "qat_single_device": "full_finetune_single_device",
    "qat_lora_finetune_distributed": "lora_finetune_distributed",
}


@dataclass(frozen=True)
class RecipeInfo:
    """A recipe that ``tune run`` can launch.

    Args:
        name (str): its name: the file's path below ``recipes/`` without ``.py`` for a built-in recipe, the
            entry-point name for a plugin's, the file stem for a ``.py`` path.
        path (Path): the recipe script.
        supports_distributed (bool): whether it may be launched with torchrun flags.
        config_patterns (tuple[str, ...]): ``fnmatch`` patterns over built-in config names it runs.
        plugin_configs (dict[str, Path]): a plugin recipe's own configs by name.
        source (str): ``"built-in"``, ``"plugin"`` or ``"file"``.
        has_info (bool): whether the file declares ``RECIPE_INFO`` (plugins declare it in their RecipeSpec).
    """

    name: str
    path: Path
    supports_distributed: bool = False
    config_patterns: tuple[str, ...] = ()
    plugin_configs: dict[str, Path] = field(default_factory=dict)
    source: str = "built-in"
    has_info: bool = True

    def claims(self, config_name: str) -> bool:
        """Whether this recipe runs the config named ``config_name``."""
        if config_name in self.plugin_configs:
            return True
        return any(fnmatch.fnmatchcase(config_name, pattern) for pattern in self.config_patterns)


def shipped_dirs() -> tuple[Path | None, Path | None]:
    """The folders holding the built-in recipes and configs (``None`` for one that does not exist).

    Returns:
        tuple[Path | None, Path | None]: ``(recipes_dir, configs_dir)``.
    """
    shipped = _PACKAGE_DIR / "_shipped"
    if shipped.is_dir():  # an installed wheel
        base = shipped
    elif (_PACKAGE_DIR.parent / "pyproject.toml").is_file():  # a source checkout or an editable install
        base = _PACKAGE_DIR.parent
    else:
        return None, None
    recipes, configs = base / "recipes", base / "configs"
    return (recipes if recipes.is_dir() else None), (configs if configs.is_dir() else None)


def read_recipe_info(path: str | Path) -> dict[str, Any] | None:
    """Reads the ``RECIPE_INFO = {...}`` literal of a recipe file without importing it.

    Args:
        path (str | Path): the recipe script.

    Returns:
        dict[str, Any] | None: the literal, or ``None`` when the file declares none.

    Raises:
        RecipeError: when the file does not parse, or ``RECIPE_INFO`` is not a literal dict of the documented
            keys and types.
    """
    path = Path(path)
    key = file_version(path)
    if key not in _INFO_CACHE:
        _INFO_CACHE[key] = _read_recipe_info(path)
    return copy.deepcopy(_INFO_CACHE[key])


# parsing every recipe file is most of the time `tune run`, `tune ls` and `tune validate` spend before they start:
# each file's RECIPE_INFO is read once per version of the file
_INFO_CACHE: dict[tuple, dict[str, Any] | None] = {}


def _read_recipe_info(path: Path) -> dict[str, Any] | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        raise RecipeError(f"recipe {path} has a syntax error at line {err.lineno}: {err.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == _INFO_NAME for t in targets):
            continue
        try:
            info = ast.literal_eval(node.value)
        except ValueError:
            raise RecipeError(
                f"{path}:{node.lineno}: {_INFO_NAME} must be a literal dict (no names or calls)"
            ) from None
        _check_info(info, path, node.lineno)
        return info
    return None


def _check_info(info: Any, path: Path, line: int) -> None:
    where = f"{path}:{line}: {_INFO_NAME}"
    if not isinstance(info, dict):
        raise RecipeError(f"{where} must be a dict, got {type(info).__name__}")
    for key, kind in _INFO_KEYS.items():
        if key in info and not isinstance(info[key], kind):
            raise RecipeError(f"{where}[{key!r}] must be a {kind.__name__}, got {info[key]!r}")
    if not all(isinstance(p, str) for p in info.get("configs", [])):
        raise RecipeError(f"{where}['configs'] must list fnmatch patterns as strings, got {info['configs']!r}")
    from tune.config._training import OPTIONAL_KEYS

    unknown = [t for t in info.get("optional_keys", []) if t not in OPTIONAL_KEYS]
    if unknown:
        raise RecipeError(f"{where}['optional_keys'] names unknown tables {unknown}; known: {', '.join(OPTIONAL_KEYS)}")


def recipe_from_file(path: str | Path, name: str | None = None, source: str = "file") -> RecipeInfo:
    """Describes the recipe script at ``path`` from its ``RECIPE_INFO``.

    Raises:
        RecipeError: when the file is missing or its ``RECIPE_INFO`` is malformed.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    info = read_recipe_info(path)
    return RecipeInfo(
        name=name or path.stem,
        path=path,
        supports_distributed=bool((info or {}).get("supports_distributed", False)),
        config_patterns=tuple((info or {}).get("configs", ())),
        source=source,
        has_info=info is not None,
    )


def builtin_recipes() -> dict[str, RecipeInfo]:
    """The recipes shipped with tune, by name (``dev/x`` for ``recipes/dev/x.py``)."""
    recipes_dir, _ = shipped_dirs()
    if recipes_dir is None:
        return {}
    found = {}
    for path in sorted(recipes_dir.rglob("*.py")):
        rel = path.relative_to(recipes_dir)
        if any(part.startswith(("_", ".")) for part in rel.parts):
            continue  # __init__.py, helpers, caches
        name = rel.with_suffix("").as_posix()
        found[name] = recipe_from_file(path, name=name, source="built-in")
    return found


def builtin_configs() -> dict[str, Path]:
    """The configs shipped with tune: name (path below ``configs/`` without ``.yaml``) -> file."""
    _, configs_dir = shipped_dirs()
    if configs_dir is None:
        return {}
    return {
        path.relative_to(configs_dir).with_suffix("").as_posix(): path
        for path in sorted(configs_dir.rglob("*.yaml"))
        if not any(part.startswith(".") for part in path.relative_to(configs_dir).parts)
    }


def shipped_config_name(path: str | Path) -> str | None:
    """The name of the built-in config at ``path`` (``configs/x/y.yaml`` -> ``x/y``), or None if it is not one."""
    _, configs_dir = shipped_dirs()
    path = Path(path).resolve()
    if configs_dir is None or path.suffix != ".yaml" or not path.is_relative_to(configs_dir.resolve()):
        return None
    return path.relative_to(configs_dir.resolve()).with_suffix("").as_posix()


def plugin_recipes() -> dict[str, RecipeInfo]:
    """Recipes added by installed plugins (``tune.plugins`` entry points whose object is a RecipeSpec)."""
    found = {}
    for name, spec in plugins.load_all(plugins.RecipeSpec).items():
        path = Path(spec.path)
        if not path.is_file():
            warnings.warn(f"tune plugin {name!r} names a recipe file that does not exist: {path}", stacklevel=2)
            continue
        found[name] = RecipeInfo(
            name=name,
            path=path.resolve(),
            supports_distributed=spec.supports_distributed,
            plugin_configs=_spec_configs(spec),
            source="plugin",
        )
    return found


def _spec_configs(spec: plugins.RecipeSpec) -> dict[str, Path]:
    configs: dict[str, Path] = {}
    for entry in spec.configs:
        entry = Path(entry)
        if entry.is_dir():
            for path in sorted(entry.rglob("*.yaml")):
                configs[path.relative_to(entry).with_suffix("").as_posix()] = path.resolve()
        elif entry.is_file():
            configs[entry.stem] = entry.resolve()
        else:
            warnings.warn(f"a tune plugin names a config that does not exist: {entry}", stacklevel=3)
    return configs


def list_recipes(include_plugins: bool = True) -> dict[str, RecipeInfo]:
    """Every recipe by name: built-in ones, then plugins' (a built-in name wins a clash).

    Args:
        include_plugins (bool): also load the installed plugins.

    Returns:
        dict[str, RecipeInfo]: the recipes.
    """
    recipes = builtin_recipes()
    if include_plugins:
        for name, info in plugin_recipes().items():
            if name in recipes:
                warnings.warn(
                    f"tune plugin recipe {name!r} is hidden by the built-in recipe of that name", stacklevel=2
                )
                continue
            recipes[name] = info
    return recipes


def list_configs(include_plugins: bool = True) -> dict[str, Path]:
    """Every config by name: built-in ones, then plugin recipes' (a built-in name wins a clash)."""
    configs = builtin_configs()
    if include_plugins:
        for info in plugin_recipes().values():
            for name, path in info.plugin_configs.items():
                configs.setdefault(name, path)
    return configs


def configs_of(recipe: RecipeInfo, configs: dict[str, Path] | None = None) -> dict[str, Path]:
    """The configs ``recipe`` runs, by name."""
    if recipe.plugin_configs:
        return dict(recipe.plugin_configs)
    configs = builtin_configs() if configs is None else configs
    return {name: path for name, path in configs.items() if recipe.claims(name)}


def recipes_for_config(config_name: str, recipes: Iterable[RecipeInfo] | None = None) -> list[RecipeInfo]:
    """The recipes that claim the config named ``config_name`` (normally exactly one)."""
    recipes = list_recipes().values() if recipes is None else recipes
    return [r for r in recipes if r.claims(config_name)]


def find_recipe(name: str) -> RecipeInfo:
    """The recipe ``tune run NAME`` means: a built-in name, a plugin's name, a ``.py`` path, or ``module:attr``.

    torchtune's QAT recipe names (:data:`RECIPE_ALIASES`: ``qat_distributed``, ``qat_single_device``,
    ``qat_lora_finetune_distributed``) give the built-in recipe that runs their configs.

    Args:
        name (str): what the user typed.

    Returns:
        RecipeInfo: the recipe.

    Raises:
        RecipeError: naming the path of a missing file, or suggesting the closest recipe names.
    """
    builtins = builtin_recipes()
    if name in builtins:
        return builtins[name]
    if RECIPE_ALIASES.get(name) in builtins:  # torchtune's QAT recipe names
        return builtins[RECIPE_ALIASES[name]]
    path = Path(name).expanduser()
    if name.endswith(".py") or path.is_file():
        if path.is_file():
            return recipe_from_file(path)
        hint = f" (the built-in recipe is named {path.stem!r}, without .py)" if path.stem in builtins else ""
        raise RecipeError(f"recipe file not found: {path.resolve()}{hint}")
    plugin = _plugin_recipe(name)
    if plugin is not None:
        return plugin
    names = sorted(set(builtins) | set(plugins.entry_points()))
    raise RecipeError(f"unknown recipe {name!r}{close_names(name, names)} (`tune ls` lists the recipes)")


def _plugin_recipe(name: str) -> RecipeInfo | None:
    if name.lower() in plugins.entry_points():
        obj = plugins.load(name)
        if obj is None:
            raise RecipeError(f"the tune plugin {name!r} failed to load (see the warning above)")
    elif ":" in name or "." in name:
        try:
            obj = plugins.resolve_object(name)
        except (ImportError, AttributeError):
            return None
    else:
        return None
    if not isinstance(obj, plugins.RecipeSpec):
        raise RecipeError(f"{name!r} is a {type(obj).__name__}, not a tune.plugins.RecipeSpec; it cannot be run")
    key = name.lower() if name.lower() in plugins.entry_points() else name
    return RecipeInfo(
        name=key,
        path=Path(obj.path).resolve(),
        supports_distributed=obj.supports_distributed,
        plugin_configs=_spec_configs(obj),
        source="plugin",
    )


def find_config(name: str) -> Path:
    """The file a config argument means: an existing file, a built-in config name, or a plugin config name.

    Args:
        name (str): a path (``my.yaml``) or a name (``llama3_2/1B_lora_single_device``).

    Returns:
        Path: the YAML file.

    Raises:
        ConfigError: naming the path of a missing file, or suggesting the closest config names.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    configs = builtin_configs()
    if name in configs:
        return configs[name]
    if path.suffix in (".yaml", ".yml"):
        stem = name[: -len(path.suffix)]
        hint = f" (the built-in config is named {stem!r}, without {path.suffix})" if stem in configs else ""
        raise ConfigError(f"config file not found: {path.resolve()}{hint}")
    configs = list_configs()
    if name in configs:
        return configs[name]
    raise ConfigError(f"unknown config {name!r}{close_names(name, list(configs))} (`tune ls` lists the configs)")


def close_names(name: str, candidates: list[str], n: int = 5) -> str:
    """``"; did you mean a, b?"`` with the candidates closest to ``name`` (by similarity, then by substring)."""
    lowered = {c.lower(): c for c in candidates}
    close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)]
    close += [c for c in candidates if name.lower() in c.lower() and c not in close]
    close = close[:n]
    return f"; did you mean {', '.join(close)}?" if close else ""
