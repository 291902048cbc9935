"""Third-party extensions through the ``tune.plugins`` entry-point group.

A distribution extends tune by declaring entry points in the ``tune.plugins`` group, for example::

    [project.entry-points."tune.plugins"]
    my_recipe = "my_pkg.recipes:RECIPE"            # a tune.plugins.RecipeSpec
    my_family = "my_pkg.model:FAMILY"              # a tune.registry.ModelFamily
    my_dataset = "my_pkg.data:my_dataset"          # any callable: usable as `_component_: my_dataset`
    my_converter = "my_pkg.convert:MyConverter"    # a model converter class

Entry-point names are lower-cased. Discovery is lazy (nothing is imported until a plugin is asked for), and a
plugin that fails to load is reported once as a warning naming it and the error; it never breaks the caller.
"""

import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUP = "tune.plugins"


@dataclass(frozen=True)
class RecipeSpec:
    """A recipe shipped by a plugin.

    ``tune ls`` lists it under its entry-point name, ``tune run NAME --config CONFIG`` runs it, ``tune cp``
    copies it and its configs, and ``tune validate`` checks its configs against it.

    Args:
        path (str | Path): the recipe's ``.py`` file (a script whose ``recipe_main`` is wrapped in
            ``tune.config.parse``), as an absolute path, e.g. ``Path(__file__).with_name("my_recipe.py")``.
        configs (tuple[str | Path, ...]): its config files, or directories searched recursively for ``*.yaml``.
            A config is named by its path relative to the directory (or its file stem), without ``.yaml``;
            a built-in config of the same name wins.
        supports_distributed (bool): whether ``tune run --nproc_per_node N`` may launch it.
    """

    path: str | Path
    configs: tuple[str | Path, ...] = field(default_factory=tuple)
    supports_distributed: bool = False


_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
_loaded: dict[str, Any] = {}
_failed: dict[str, str] = {}


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """All ``tune.plugins`` entry points by lower-cased name, without loading any of them."""
    global _entry_points
    if _entry_points is None:
        found: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=GROUP):
            found.setdefault(ep.name.lower(), ep)
        _entry_points = found
    return _entry_points


def load(name: str) -> Any | None:
    """Loads the plugin named ``name`` (entry-point name, case-insensitive).

    Returns:
        Any | None: the object the entry point names, or ``None`` when there is no such plugin or it failed to
        load (the failure is warned about once).
    """
    key = name.lower()
    if key in _loaded:
        return _loaded[key]
    if key in _failed:
        return None
    ep = entry_points().get(key)
    if ep is None:
        return None
    try:
        obj = ep.load()
    except Exception as err:  # a broken plugin must not break tune: report it and carry on
        _failed[key] = f"{type(err).__name__}: {err}"
        warnings.warn(f"tune plugin {key!r} ({ep.value}) failed to load and is ignored: {_failed[key]}", stacklevel=2)
        return None
    _loaded[key] = obj
    return obj


def load_all(kind: type | None = None) -> dict[str, Any]:
    """Loads every plugin (or every plugin whose object is an instance of ``kind``) by name."""
    out = {}
    for name in entry_points():
        obj = load(name)
        if obj is not None and (kind is None or isinstance(obj, kind)):
            out[name] = obj
    return out


def resolve_object(path: str) -> Any:
    """Resolves ``path`` to an object: a plugin name, ``package.module:attr`` or ``package.module.attr``.

    Raises:
        ImportError: naming the path when nothing matches.
    """
    if ":" in path:
        module_name, _, attr = path.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ImportError(f"cannot import {path!r}: {err}") from err
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError as err:
            raise ImportError(f"cannot import {path!r}: {err}") from err
        return obj
    if "." not in path:
        obj = load(path)
        if obj is None:
            if path.lower() in _failed:
                raise ImportError(f"the tune plugin {path.lower()!r} failed to load: {_failed[path.lower()]}")
            raise ImportError(f"{path!r} is neither a dotted path nor the name of an installed tune plugin")
        return obj
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as err:
            # only keep walking up when the module itself is missing, not one of its own imports
            if err.name is not None and not ".".join(parts[:i]).startswith(err.name):
                raise
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError as err:
            raise ImportError(f"cannot import {path!r}: {err}") from err
        return obj
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as err:
        raise ImportError(f"cannot import {path!r}: {err}") from err


def _reset_for_tests() -> None:
    """Forgets discovered and loaded plugins (tests install distributions at run time)."""
    global _entry_points
    _entry_points = None
    _loaded.clear()
    _failed.clear()
