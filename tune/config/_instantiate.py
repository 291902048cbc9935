import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tune import plugins
from tune.config._errors import ConfigError, ConfigProblem
from tune.config._load import COMPONENT_KEY
from tune.utils import install_hint


def instantiate(config: Any, *args: Any, **kwargs: Any) -> Any:
    """Builds the object a config node describes.

    A node ``{_component_: path, k1: v1, ...}`` becomes ``path(*args, k1=v1, ..., **kwargs)``: the sibling keys
    are keyword arguments, nested component nodes (also inside lists and plain mappings) are built first, and
    the arguments given here are added at call time, keyword ones taking precedence over the config's
    (``instantiate(cfg.optimizer, model.parameters())``, ``instantiate(cfg.dataset, tokenizer=tok)``). Plain
    mappings and lists reach the component as ``dict`` and ``list``, never as config objects.

    ``path`` is resolved by :func:`get_component_from_path`: a dotted path, ``module:attr``, the name of an
    installed plugin, or a name defined in the running recipe file. The working directory is importable, so
    ``_component_: my_dataset.build`` finds ``./my_dataset.py``.

    Args:
        config (DictConfig | ListConfig | Mapping | list | None): the node. A list instantiates each item with
            the same arguments; ``None`` gives ``None`` (an optional component switched off).
        *args (Any): positional arguments passed first.
        **kwargs (Any): keyword arguments that override the config's.

    Returns:
        Any: what the component returned (a list of them for a list).

    Raises:
        ConfigError: naming the key path when the node has no ``_component_``, the component cannot be
            imported, an interpolation cannot be resolved, or the arguments do not match its signature.
    """
    if config is None:
        return None
    if not isinstance(config, (DictConfig, ListConfig)):
        if not isinstance(config, (Mapping, list, tuple)):
            raise ConfigError(
                f"instantiate() needs a config node with a {COMPONENT_KEY!r} key, got {type(config).__name__}"
            )
        config = OmegaConf.create(config if not isinstance(config, tuple) else list(config))
    key = key_path(config)
    try:
        node = OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(_omegaconf_problem(err, key)) from None
    if isinstance(node, list):
        return [_build_top(item, f"{key}[{i}]", args, kwargs) for i, item in enumerate(node)]
    return _build_top(node, key, args, kwargs)


def _build_top(node: Any, key: str, args: tuple, kwargs: dict) -> Any:
    if node is None:
        return None
    if not isinstance(node, dict) or COMPONENT_KEY not in node:
        raise ConfigError(
            ConfigProblem(key, f"cannot instantiate: the node has no {COMPONENT_KEY!r} key naming what to build", node)
        )
    return _call(node, key, args, kwargs)


def _build(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if COMPONENT_KEY in value:
            return _call(value, key, (), {})
        return {k: _build(v, _join(key, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _call(node: dict, key: str, args: tuple, kwargs: dict) -> Any:
    path = node[COMPONENT_KEY]
    component = get_component_from_path(path, key=_join(key, COMPONENT_KEY))
    if not callable(component):
        raise ConfigError(ConfigProblem(_join(key, COMPONENT_KEY), "names an object that is not callable", path))
    call_kwargs = {k: _build(v, _join(key, k)) for k, v in node.items() if k != COMPONENT_KEY}
    call_kwargs.update(kwargs)
    _check_binds(component, path, key, args, call_kwargs)
    try:
        return component(*args, **call_kwargs)
    except ValueError as err:
        # components raise ValueError for values a user can fix (STYLE 8): report it against the config key, so
        # the CLI prints one line; the original stays chained for TUNE_DEBUG=1
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(ConfigProblem(key or "<root>", f"{path} rejected its arguments: {err}")) from err
    except Exception as err:
        if hasattr(err, "add_note"):  # Python 3.11+: say which config node was being built
            err.add_note(f"(while instantiating config key {key or '<root>'!r}: {path})")
        raise


def _check_binds(component: Any, path: str, key: str, args: tuple, kwargs: dict) -> None:
    try:
        signature = inspect.signature(component)
    except (TypeError, ValueError):  # some builtins have no signature: let the call itself decide
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        accepted = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        message = f"the arguments do not match {path}{signature}: {err}"
        unknown = [k for k in kwargs if k not in signature.parameters]
        for name in unknown:
            close = difflib.get_close_matches(name, accepted, n=1)
            if close:
                message += f" (did you mean {close[0]!r} instead of {name!r}?)"
        raise ConfigError(ConfigProblem(key or "<root>", message)) from None


def get_component_from_path(path: str, key: str = "") -> Any:
    """Resolves the name of a component to the object.

    Tried in order: ``module:attr``; a name defined in the running recipe file (``sys.modules["__main__"]``,
    so a copied recipe can define its own components); a dotted path ``package.module.attr`` (the working
    directory is importable); the entry-point name of an installed ``tune.plugins`` plugin.

    Args:
        path (str): the name.
        key (str): the config key it came from, for the error message.

    Returns:
        Any: the object.

    Raises:
        ConfigError: naming the key and the path, with the closest existing names when there are any.
    """
    if not isinstance(path, str) or not path:
        raise ConfigError(ConfigProblem(key, "a component must be named by a non-empty string", path))
    main_obj = _from_main(path)
    if main_obj is not None:
        return main_obj
    return import_component(path, key)


# torchtune names that `tune migrate` renames beyond the prefix (tune._cli._migrate.RENAMES)
_TORCHTUNE_RENAMED = frozenset(
    {
        "torchtune.config._utils._get_component_from_path",
        "torchtune.modules.common_utils",
        "torchtune.modules.tokenizers",
    }
)


def import_component(path: str, key: str = "") -> Any:
    """Resolves ``module:attr``, a dotted path or a plugin name (not names of the running recipe).

    Raises:
        ConfigError: naming the key and the path, with the closest existing names when there are any.
    """
    _ensure_cwd_importable()
    try:
        return plugins.resolve_object(path)
    except (ImportError, AttributeError) as err:
        missing = _missing_optional_package(err)
        if missing is not None:  # an optional dependency of tune's (bitsandbytes optimizers, say)
            message = f"needs the optional package `{missing}`, which is not installed. Run: {install_hint(missing)}"
            raise ConfigError(ConfigProblem(key, message, path)) from None
        if path.startswith("torchtune."):  # a config not migrated yet
            becomes = "" if path in _TORCHTUNE_RENAMED else f" (it becomes {'tune' + path[len('torchtune') :]!r})"
            message = f"a torchtune name; run `tune migrate CONFIG`{becomes}, see docs/migrating.md"
            raise ConfigError(ConfigProblem(key, message, path)) from None
        reason = str(err).removeprefix(f"cannot import {path!r}: ")  # the path is shown with the key already
        raise ConfigError(ConfigProblem(key, f"cannot import it: {reason}{_suggest(path)}", path)) from None


def _missing_optional_package(err: BaseException) -> str | None:
    # the ModuleNotFoundError behind the failure, when the module it names is one of tune's optional dependencies
    while err is not None:
        if isinstance(err, ModuleNotFoundError) and err.name and install_hint(err.name):
            return err.name.split(".")[0]
        err = err.__cause__ or err.__context__
    return None


def _ensure_cwd_importable() -> None:
    # `python my_recipe.py` puts the recipe's folder on sys.path, not the working directory; configs refer to
    # `my_dataset.build` next to them. Appended, so it never shadows installed packages.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _from_main(path: str) -> Any:
    main = sys.modules.get("__main__")
    if main is None or ":" in path:
        return None
    head, *rest = path.split(".")
    obj = getattr(main, head, None)
    if obj is None or inspect.ismodule(obj):
        return None  # `torch.optim.AdamW` in a recipe that did `import torch` is a dotted path, not a local name
    for part in rest:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _suggest(path: str) -> str:
    """`; did you mean ...?` built from what does exist under the longest importable prefix of ``path``."""
    parts = path.replace(":", ".").split(".")
    if len(parts) == 1:
        names = list(plugins.entry_points())
        close = difflib.get_close_matches(path.lower(), names, n=3)
        return f"; installed plugins with a close name: {', '.join(close)}" if close else ""
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(prefix)
        except Exception:
            continue
        for j, part in enumerate(parts[i:]):
            if not hasattr(obj, part):
                names = [n for n in dir(obj) if not n.startswith("_")]
                close = difflib.get_close_matches(part, names, n=3)
                if close:
                    base = ".".join(parts[: i + j])
                    return "; did you mean " + ", ".join(f"{base}.{c}" for c in close) + "?"
                return ""
            obj = getattr(obj, part)
        return ""
    return ""


def key_path(node: Any) -> str:
    """The key path of an OmegaConf node from the root (``dataset[1].source``), ``""`` for the root."""
    parts: list[str] = []
    current = node
    while current is not None:
        parent = current._get_parent()
        key = current._key()
        if parent is None or key is None:
            break
        parts.append(f"[{key}]" if isinstance(parent, ListConfig) else f".{key}")
        current = parent
    return "".join(reversed(parts)).lstrip(".")


def _join(key: str, child: Any) -> str:
    if isinstance(child, int):
        return f"{key}[{child}]"
    return f"{key}.{child}" if key else str(child)


def _omegaconf_problem(err: OmegaConfBaseException, fallback_key: str) -> ConfigProblem:
    key = getattr(err, "full_key", None) or fallback_key
    return ConfigProblem(key, str(err).splitlines()[0])
