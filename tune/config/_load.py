import difflib
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tune.config._errors import ConfigError, ConfigProblem

# `a`, `a.b`, `a.b.0`, `a.b[0].c`, keys with dashes
_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+|\[\d+\])*$")
_OVERRIDE_FORMS = "`key=value` (e.g. `batch_size=8`, `optimizer.lr=2e-5`) or `~key` to delete a key"
COMPONENT_KEY = "_component_"


def read_yaml(path: str | Path) -> DictConfig:
    """Reads a YAML config file.

    Args:
        path (str | Path): the file.

    Returns:
        DictConfig: its contents, interpolations left unresolved.

    Raises:
        ConfigError: naming the path when the file is missing, and the line and column of a YAML syntax error
            (or duplicate key); also when the top level is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path.resolve()}")
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_problem(err), source=str(path)) from None
    except OmegaConfBaseException as err:
        raise ConfigError(str(err).splitlines()[0], source=str(path)) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"not UTF-8 text (byte {err.start}); is this a YAML config file?", str(path)) from None
    except OSError as err:  # no permission to read it, say
        raise ConfigError(f"cannot read the config file: {err.strerror or err}", str(path)) from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError("a config must be a mapping of keys to values at the top level, got a list", str(path))
    _torchtune_qat(cfg, str(path))
    return cfg


# torchtune's QAT quantizers (`torchtune.` already replaced by `tune.`) -> the tune converter with their numerics
_TORCHTUNE_QAT_QUANTIZERS = {
    "tune.training.quantization.Int8DynActInt4WeightQATQuantizer": "tune.training.Int8DynActInt4WeightQATConverter",
}


def _torchtune_qat(cfg: DictConfig, source: str) -> None:
    """Reads a torchtune QAT ``quantizer:`` entry as tune's QAT model converter, in place.

    In a training config (one with an ``optimizer``: torchtune's qat_distributed, qat_single_device and
    qat_lora_finetune_distributed configs) the entry becomes ``model_converters: [<converter>]``; elsewhere (the
    quantize recipe's ``quantizer:``) only its component is renamed. ``fake_quant_after_n_steps: null`` is dropped;
    a number is an error, since the converter fake-quantises from the first step.
    """
    quantizer = cfg._get_node("quantizer")
    if not isinstance(quantizer, DictConfig) or quantizer.get(COMPONENT_KEY) not in _TORCHTUNE_QAT_QUANTIZERS:
        return
    converter = quantizer.copy()
    converter[COMPONENT_KEY] = _TORCHTUNE_QAT_QUANTIZERS[quantizer[COMPONENT_KEY]]
    if "optimizer" not in cfg:
        cfg.quantizer = converter
        return
    if cfg.get("model_converters") is not None:
        raise ConfigError(
            ConfigProblem(
                "quantizer",
                "torchtune's `quantizer:` is read as a QAT entry of `model_converters`, which "
                "this config sets already: move the QAT converter into `model_converters` and remove "
                "`quantizer`",
            ),
            source,
        )
    delay = cfg._get_node("fake_quant_after_n_steps")
    if delay is not None and delay._value() is not None:
        raise ConfigError(
            ConfigProblem(
                "fake_quant_after_n_steps",
                "tune's QAT converter fake-quantises from the first step and "
                "cannot start later; remove the key (or set it to null)",
                delay._value(),
            ),
            source,
        )
    if delay is not None:
        del cfg["fake_quant_after_n_steps"]
    del cfg["quantizer"]
    cfg.model_converters = [converter]


def yaml_problem(err: yaml.YAMLError) -> ConfigProblem:
    """Turns a PyYAML error into a problem with the 1-based line (and column) where the parser stopped."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    where = f" at column {mark.column + 1}" if mark is not None else ""
    message = f"YAML syntax error{where}: {problem}"
    if context:  # where the construct that broke began, e.g. "while parsing a flow sequence" on line 2
        message += f" ({context}" + (f" started at line {context_mark.line + 1})" if context_mark else ")")
    return ConfigProblem("", message, line=mark.line + 1 if mark is not None else None)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Reads a config file and applies command-line overrides to it.

    Args:
        path (str | Path): the YAML file.
        overrides (Sequence[str]): ``key=value`` and ``~key`` strings (see :func:`apply_overrides`).

    Returns:
        DictConfig: the config, interpolations (``${...}``) left to resolve on access.

    Raises:
        ConfigError: for a missing file, a YAML syntax error, or a malformed override.
    """
    cfg = read_yaml(path)
    apply_overrides(cfg, overrides)
    return cfg


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Applies command-line overrides to ``cfg`` in place, in order.

    - ``a.b=v`` sets a key (creating it when missing). ``v`` is read as a YAML value (``8``, ``2e-5``, ``true``,
      ``null``, ``[1, 2]``, ``{x: 1}``); anything else stays a string, ``=`` and ``: `` included
      (``prompt=Q: a=b``). ``key=`` sets the empty string.
    - ``~a.b`` deletes a key.
    - ``a=other.dotted.path`` on a component node (one with ``_component_``) swaps the component and keeps its
      arguments.
    - ``a=${b.c}`` sets an interpolation, resolved when the config is read.
    - List items are addressed as ``a.0.b`` or ``a[0].b``.

    Args:
        cfg (DictConfig): the config to change.
        overrides (Iterable[str]): the overrides.

    Returns:
        DictConfig: ``cfg`` itself.

    Raises:
        ConfigError: listing every malformed override, with the expected form.
    """
    problems = []
    for override in overrides:
        try:
            _apply_one(cfg, override)
        except ConfigError as err:
            problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _apply_one(cfg: DictConfig, override: str) -> None:
    if override.startswith("~"):
        key = override[1:]
        _check_key(key, override)
        _delete(cfg, key, override)
        return
    key, sep, text = override.partition("=")
    if not sep:
        raise ConfigError(ConfigProblem("", f"bad override {override!r}: expected {_OVERRIDE_FORMS}"))
    _check_key(key, override)
    value = parse_override_value(text, key)
    existing = select_node(cfg, key)
    if isinstance(existing, DictConfig) and COMPONENT_KEY in existing and isinstance(value, str):
        key, value = f"{key}.{COMPONENT_KEY}", value  # swap the component, keep its arguments
    elif existing is _MISSING:
        _warn_if_typo(cfg, key)
    try:
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    except (OmegaConfBaseException, ValueError, TypeError) as err:
        first = str(err).splitlines()[0]
        raise ConfigError(ConfigProblem(key, f"cannot apply override {override!r}: {first}")) from None


def _check_key(key: str, override: str) -> None:
    if not _KEY.match(key):
        raise ConfigError(
            ConfigProblem("", f"bad override {override!r}: {key!r} is not a key path; expected {_OVERRIDE_FORMS}")
        )


def parse_override_value(text: str, key: str = "") -> Any:
    """Reads the value of a ``key=value`` override the way a YAML file would, falling back to a plain string.

    Args:
        text (str): what follows the first ``=``.
        key (str): the key, for error messages.

    Returns:
        Any: an int, float, bool, None, str, list or dict.

    Raises:
        ConfigError: when a value that opens a YAML list, mapping or quoted string does not parse
            (``[1, 2`` is more likely a typo than a string).
    """
    if text == "":
        return ""
    if "\n" in text or text.startswith("#") or " #" in text:
        return text  # YAML would read `#...` as a comment: `color=#fff` means the string
    try:
        # parsed by OmegaConf's YAML loader, so `1e-5` is a float exactly as in a config file
        value = OmegaConf.to_container(OmegaConf.create(f"v: {text}"), resolve=False)["v"]
    except (yaml.YAMLError, OmegaConfBaseException) as err:
        if text.lstrip()[:1] in ("[", "{", '"', "'"):
            first = str(err).splitlines()[0]
            raise ConfigError(ConfigProblem(key, f"cannot read {text!r} as a YAML value: {first}")) from None
        return text  # `prompt=Q: hi` is a string with a colon
    if isinstance(value, dict) and not text.lstrip().startswith("{"):
        return text
    return value


class _Missing:
    pass


_MISSING = _Missing()


def select_node(cfg: DictConfig, key: str) -> Any:
    """The raw value at ``key`` (interpolations unresolved), or a sentinel when the key does not exist."""
    node: Any = cfg
    for part in split_key(key):
        if isinstance(node, DictConfig) and isinstance(part, str) and node._get_node(part) is not None:
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and isinstance(part, int) and -len(node) <= part < len(node):
            node = node._get_node(part)
        else:
            return _MISSING
        if not isinstance(node, (DictConfig, ListConfig)):
            node = node._value()
    return node


def split_key(key: str) -> list[str | int]:
    """``"a.b[0].c"`` or ``"a.b.0.c"`` -> ``["a", "b", 0, "c"]``."""
    parts: list[str | int] = []
    for piece in key.replace("[", ".").replace("]", "").split("."):
        if piece:
            parts.append(int(piece) if piece.isdigit() else piece)
    return parts


def _delete(cfg: DictConfig, key: str, override: str) -> None:
    *parents, last = split_key(key)
    parent = select_node(cfg, ".".join(str(p) for p in parents)) if parents else cfg
    if isinstance(parent, DictConfig) and isinstance(last, str) and parent._get_node(last) is not None:
        del parent[last]
        return
    if isinstance(parent, ListConfig) and isinstance(last, int) and -len(parent) <= last < len(parent):
        del parent[last]
        return
    hint = ""
    if isinstance(parent, DictConfig):
        close = difflib.get_close_matches(str(last), [str(k) for k in parent.keys()], n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(ConfigProblem(key, f"cannot delete {override!r}: the config has no key {key!r}{hint}"))


def _warn_if_typo(cfg: DictConfig, key: str) -> None:
    # adding a new key is allowed (a recipe may read it), but `bach_size=4` next to `batch_size` is a typo
    *parents, last = split_key(key)
    parent = select_node(cfg, ".".join(str(p) for p in parents)) if parents else cfg
    if isinstance(parent, DictConfig) and isinstance(last, str):
        close = difflib.get_close_matches(last, [str(k) for k in parent.keys()], n=1, cutoff=0.8)
        if close:
            where = ".".join(str(p) for p in parents)
            near = f"{where}.{close[0]}" if where else close[0]
            warnings.warn(f"override adds a new key {key!r}; did you mean {near!r}?", stacklevel=4)
