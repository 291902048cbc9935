import difflib
import inspect
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tune import plugins
from tune.config._discovery import read_recipe_info
from tune.config._errors import ConfigError, ConfigProblem, RecipeError
from tune.config._imports import import_modules
from tune.config._instantiate import import_component
from tune.config._load import COMPONENT_KEY, apply_overrides, read_yaml
from tune.config._recipe_scan import KeyPath, RecipeScan, RuntimeArgs, scan_recipe
from tune.config._training import (
    apply_defaults,
    check_finetuning_schedule,
    check_model_converters,
    known_keys,
    optional_key_tables,
    table_problems,
    training_config_problems,
    unknown_key_problems,
)

_UNRESOLVED = object()  # a leaf whose interpolation failed (already reported)
_MISSING_VALUE = "???"
# a string value that names a tune object (`collate_fn: tune.data.padded_collate_sft`): checked like a component
_TUNE_PATH = re.compile(r"^tune(\.[A-Za-z_]\w*){2,}$")  # tune.pkg.name; not a file name like tune.log


def validate_config(
    config: str | Path | DictConfig,
    recipe: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> list[ConfigProblem]:
    """Checks a config without running the recipe or building a model, and returns every problem found.

    The modules listed under ``imports:`` are imported first (that runs their code, which registers components)
    and any that cannot be imported is reported. Checked: YAML syntax (with line numbers), the overrides,
    ``${...}`` interpolations, ``???`` values left unset, every ``_component_`` in the tree (nested and in lists)
    is importable, the arguments of each component against its signature (unknown ones, missing required ones,
    ones the recipe already passes), and string values that name a ``tune.*`` object. With a recipe, also the
    keys it reads that the config lacks, and the arguments it adds at run time
    (``instantiate(cfg.optimizer, model.parameters())``) are taken into account; the optional keys of the
    recipe's tables (``RECIPE_INFO["optional_keys"]``) are filled in first, and a training recipe's settings are
    checked as it checks them when it starts. ``model_converters`` and ``finetuning_schedule`` are checked in
    every config, and so are the values (:func:`value_problems`: types against the components' annotations,
    ranges, dtype and device names, dataset options, checkpoint shards); whether the device is on this machine
    is left to ``tune run``.

    Args:
        config (str | Path | DictConfig): a YAML file or a loaded config.
        recipe (str | Path | None): the recipe script the config is for. Without one, arguments missing from
            top-level components and keys the recipe reads are not checked (the recipe may supply them).
        overrides (Sequence[str]): ``key=value`` / ``~key`` overrides applied first.

    Returns:
        list[ConfigProblem]: the problems, empty when the config is valid.
    """
    try:
        cfg = read_yaml(config) if not isinstance(config, DictConfig) else config.copy()
    except ConfigError as err:
        return err.problems  # nothing else can be checked in a file that does not parse
    problems: list[ConfigProblem] = []
    try:
        apply_overrides(cfg, overrides)
    except ConfigError as err:
        problems += err.problems
    try:  # first: the modules may register what the rest of the config names (a model family, a plugin name)
        import_modules(cfg)
    except ConfigError as err:
        problems += err.problems
    scan, info = None, None
    if recipe is not None:
        try:
            scan = scan_recipe(recipe)
            info = read_recipe_info(recipe)
        except (OSError, SyntaxError, RecipeError) as err:
            problems.append(ConfigProblem("", f"cannot read the recipe {recipe}: {err}"))
    tables = optional_key_tables(info)
    apply_defaults(cfg, tables)  # as the recipe will see it
    checker = _Checker(cfg, scan, problems)
    tree = checker.resolve(OmegaConf.to_container(cfg, resolve=False), "")
    checker.check_tree(tree, "")
    if scan is not None:
        checker.check_reads(tree)
    if scan is not None and isinstance(info, dict) and "optional_keys" in info:  # the recipe knows its keys
        problems += unknown_key_problems(cfg, scan.mentioned | known_keys(tables))
    problems += check_model_converters(cfg.get("model_converters"))
    reported = {p.key for p in problems}
    problems += [p for p in value_problems(tree, check_devices=False) if p.key not in reported]
    problems += _settings_problems(cfg, tables, bool((info or {}).get("supports_distributed")), problems)
    return problems


def _settings_problems(
    cfg: DictConfig, tables: list[str], distributed: bool, found: list[ConfigProblem]
) -> list[ConfigProblem]:
    # the checks the training recipes run first, on keys whose values resolved
    if any(not p.key for p in found):
        return []  # the file or the recipe could not be read as a whole
    try:
        problems = check_finetuning_schedule(
            cfg.get("finetuning_schedule"), cfg.get("finetuning_schedule_auto_transition")
        )
        if "finetune" in tables:
            problems += training_config_problems(cfg, distributed=distributed)
        problems += table_problems(cfg, tables)
    except OmegaConfBaseException:
        return []  # an interpolation that does not resolve: reported by the tree check
    reported = {p.key for p in found}
    return [p for p in problems if p.key not in reported]


class _Checker:
    def __init__(self, cfg: DictConfig, scan: RecipeScan | None, problems: list[ConfigProblem]):
        self.cfg = cfg
        self.scan = scan
        self.problems = problems

    def problem(self, key: str, message: str, value: Any = inspect.Parameter.empty) -> None:
        if value is inspect.Parameter.empty:
            self.problems.append(ConfigProblem(key, message))
        else:
            self.problems.append(ConfigProblem(key, message, value))

    # -- interpolations and unset values ------------------------------------------------------------------

    def resolve(self, node: Any, key: str) -> Any:
        """A copy of the raw tree with every interpolation resolved (or _UNRESOLVED, reported)."""
        if isinstance(node, dict):
            return {k: self.resolve(v, _join(key, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, _join(key, i)) for i, v in enumerate(node)]
        if node == _MISSING_VALUE:
            self.problem(key, "mandatory value not set (`???`): set it in the config or with an override", node)
            return _UNRESOLVED
        if isinstance(node, str) and "${" in node:
            try:
                value = OmegaConf.select(self.cfg, key, throw_on_missing=True)
                if isinstance(value, (DictConfig, ListConfig)):
                    value = OmegaConf.to_container(value, resolve=True)
            except OmegaConfBaseException as err:
                self.problem(key, f"cannot resolve the interpolation: {_first_line(err)}", node)
                return _UNRESOLVED
            return value
        return node

    # -- components --------------------------------------------------------------------------------------

    def check_tree(self, node: Any, key: str, in_component: bool = False) -> None:
        if isinstance(node, dict):
            is_component = COMPONENT_KEY in node
            if is_component:
                self.check_component(node, key, in_component)
            for k, v in node.items():
                if k != COMPONENT_KEY:
                    self.check_tree(v, _join(key, k), in_component or is_component)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self.check_tree(v, _join(key, i), in_component)
        elif isinstance(node, str) and _TUNE_PATH.match(node):
            try:
                import_component(node, key)
            except ConfigError as err:
                self.problems.extend(err.problems)
            except Exception as err:  # the module exists but fails on import: report, never crash validate
                self.problem(key, f"importing it failed: {type(err).__name__}: {err}", node)

    def check_component(self, node: dict, key: str, nested: bool) -> None:
        name = node[COMPONENT_KEY]
        component_key = _join(key, COMPONENT_KEY)
        if name is _UNRESOLVED:
            return
        if not isinstance(name, str) or not name:
            self.problem(component_key, "a component must be named by a dotted path string", name)
            return
        signature, known = self._signature_of(name, component_key)
        if signature is None:
            return
        runtime = self._runtime_args(key)
        given = {k: v for k, v in node.items() if k != COMPONENT_KEY}
        # a component inside another one's arguments is built by instantiate, which passes it nothing; any other
        # may receive arguments from the recipe, which only a scanned recipe tells
        check_missing = known and (nested or self.scan is not None)
        _check_arguments(self, signature, name, key, given, runtime, check_missing)

    def _signature_of(self, name: str, key: str) -> tuple[inspect.Signature | None, bool]:
        """The component's signature (None when unknown) and whether it can be trusted for missing arguments."""
        head = name.split(".")[0] if ":" not in name else None
        if self.scan is not None and head is not None:
            if name in self.scan.definitions:  # defined in the recipe file itself
                signature = self.scan.definitions[name]
                return signature, signature is not None
            if head in self.scan.definitions:
                return None, False  # an attribute of a recipe-defined class: not readable without running it
            if head in self.scan.imports:
                name = self.scan.imports[head] + name[len(head) :]
        try:
            obj = import_component(name, key)
        except ConfigError as err:
            problems = err.problems
            if "." not in name and self.scan is not None:
                message = f"not defined in the recipe, not a dotted path, not a plugin{_plugins_hint(name)}"
                problems = [ConfigProblem(key, message, name)]
            self.problems.extend(problems)
            return None, False
        except Exception as err:  # the module exists but fails on import
            self.problem(key, f"importing it failed: {type(err).__name__}: {err}", name)
            return None, False
        if not callable(obj):
            self.problem(key, f"names a {type(obj).__name__}, which cannot be called", name)
            return None, False
        try:
            return inspect.signature(obj), True
        except (TypeError, ValueError):
            return None, False

    def _runtime_args(self, key: str) -> RuntimeArgs | None:
        if self.scan is None:
            return None
        path = _key_tuple(key)
        found = None
        candidates = [path] + ([path[:-1]] if path and path[-1] == "*" else [])
        for candidate in candidates:  # instantiate(cfg.dataset, tok) on a list instantiates every item
            if candidate in self.scan.runtime_args:
                found = found or RuntimeArgs()
                found.merge(self.scan.runtime_args[candidate])
        return found

    # -- keys the recipe reads ---------------------------------------------------------------------------

    def check_reads(self, tree: Any) -> None:
        assert self.scan is not None
        reported: set[str] = set()
        for path, line in sorted(self.scan.reads.items(), key=lambda item: item[1]):
            for missing in _missing_keys(tree, path, ""):
                if missing not in reported:
                    reported.add(missing)
                    self.problem(
                        missing, f"missing: the recipe reads it ({self.scan.path.name}:{line}); add it to the config"
                    )


def _check_arguments(
    checker: _Checker,
    signature: inspect.Signature,
    name: str,
    key: str,
    given: dict[str, Any],
    runtime: RuntimeArgs | None,
    check_missing: bool,
) -> None:
    P = inspect.Parameter
    params = signature.parameters
    takes_any_keyword = any(p.kind == P.VAR_KEYWORD for p in params.values())
    positional = [n for n, p in params.items() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    passed_keywords = runtime.keywords if runtime else set()
    consumed = set(positional[: runtime.num_positional]) if runtime else set()
    accepted = [n for n, p in params.items() if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
    for arg, value in given.items():
        arg_key = _join(key, arg)
        if arg in consumed and arg not in passed_keywords:
            checker.problem(arg_key, f"the recipe already passes {arg!r} of {name} positionally; remove it", value)
        elif (arg not in params or params[arg].kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL)) and not takes_any_keyword:
            close = difflib.get_close_matches(arg, accepted, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            checker.problem(
                arg_key, f"{name} has no argument {arg!r}; {hint}it accepts: {', '.join(accepted) or '(none)'}", value
            )
    if not check_missing or (runtime is not None and runtime.open_ended):
        return
    for arg, param in params.items():
        if param.default is not P.empty or param.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            continue
        if arg in given or arg in passed_keywords or arg in consumed:
            continue
        by_recipe = " (the recipe does not pass it either)" if runtime is not None else ""
        checker.problem(_join(key, arg), f"missing required argument {arg!r} of {name}{by_recipe}")


def _missing_keys(tree: Any, path: KeyPath, key: str) -> list[str]:
    """Key paths along ``path`` that the config lacks (lists: every item is checked for ``*``)."""
    if not path:
        return []
    head, rest = path[0], path[1:]
    if isinstance(tree, list):
        if head != "*":
            return []
        return [m for i, item in enumerate(tree) for m in _missing_keys(item, rest, _join(key, i))]
    if not isinstance(tree, dict) or head == "*":
        return []  # a scalar, None or an unresolved value: the recipe's own checks decide
    if head not in tree:
        return [_join(key, head)]
    return _missing_keys(tree[head], rest, _join(key, head))


def _plugins_hint(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(plugins.entry_points()), n=3)
    return f"; installed plugins with a close name: {', '.join(close)}" if close else ""


def _key_tuple(key: str) -> KeyPath:
    return tuple("*" if re.fullmatch(r"\d+", p) else p for p in key.replace("[", ".").replace("]", "").split(".") if p)


def _join(key: str, child: Any) -> str:
    if isinstance(child, int):
        return f"{key}[{child}]"
    return f"{key}.{child}" if key else str(child)


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0]


# -- values: types against annotations, ranges, devices, dataset options, checkpoint shards ------------------------

# top-level keys every training recipe reads as a count: an integer >= 1
_COUNT_KEYS = ("batch_size",)
# the files that list a Hugging Face checkpoint's shards
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# the packaged `datasets` builders whose options a dataset source like "tatsu-lab/alpaca" may take
_HUB_BUILDERS = ("parquet", "json", "csv", "text", "arrow")


def value_problems(
    cfg: DictConfig | dict, *, check_devices: bool = True, refused: Iterable[str] = ()
) -> list[ConfigProblem]:
    """The problems of a config's values that only show when the run starts: checked by ``tune validate`` and by
    ``tune run`` before the recipe starts (and before torchrun starts any process).

    Checked: each argument of each ``_component_`` against the component's annotation (``packed: maybe`` for a
    ``bool``, ``lora_rank: eight`` for an ``int``, ``lr: fast`` for a ``float``; ``Literal``, ``Optional`` and
    unions too; types it cannot check pass), the options a dataset builder passes on to ``datasets.load_dataset``
    (a misspelled one is not an option of either), ``lr`` >= 0, ``batch_size`` >= 1, ``dtype`` and ``device``
    names (and, with ``check_devices``, that the device is on this machine), and that ``checkpoint_files`` lists
    every shard that the checkpoint's index names.

    Args:
        cfg (DictConfig | dict): the config, or its tree with interpolations resolved (a value that did not
            resolve is skipped).
        check_devices (bool): report a ``device`` this machine does not have.
        refused (Iterable[str]): keys the recipe refuses with its own reason (its ``UNSUPPORTED`` table): their
            values, and those below them, are left to the recipe's check, which reports them with that reason.

    Returns:
        list[ConfigProblem]: every problem found.
    """
    from tune.utils import DTYPE_CHOICES, device_problem, get_dtype

    if isinstance(cfg, DictConfig):
        try:
            tree = OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException:
            return []  # an interpolation that does not resolve: reported where the config is loaded
    else:
        tree = cfg
    problems: list[ConfigProblem] = []
    if not isinstance(tree, dict):
        return problems
    dtype = tree.get("dtype")
    if isinstance(dtype, str) or (dtype is not None and dtype is not _UNRESOLVED):
        try:
            get_dtype(dtype if isinstance(dtype, str) else str(dtype))
        except ValueError:
            problems.append(ConfigProblem("dtype", f"must be {DTYPE_CHOICES}", dtype))
    device = tree.get("device")
    if device is not _UNRESOLVED:
        message = device_problem(device, check_present=check_devices)
        if message:
            problems.append(ConfigProblem("device", message, device))
    for key in _COUNT_KEYS:
        value = tree.get(key)
        if key in tree and value is not _UNRESOLVED and (not isinstance(value, int) or isinstance(value, bool)):
            problems.append(ConfigProblem(key, "must be an integer >= 1", value))
        elif isinstance(value, int) and value < 1:
            problems.append(ConfigProblem(key, "must be an integer >= 1", value))
    _component_values(tree, "", problems)
    refused = tuple(refused)
    return [p for p in problems if not any(p.key == k or p.key.startswith(f"{k}.") for k in refused)]


def _component_values(node: Any, key: str, problems: list[ConfigProblem]) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _component_values(item, _join(key, i), problems)
        return
    if not isinstance(node, dict):
        return
    name = node.get(COMPONENT_KEY)
    if isinstance(name, str) and name:
        _check_values_of(name, node, key, problems)
    for k, v in node.items():
        if k != COMPONENT_KEY:
            _component_values(v, _join(key, k), problems)


def _check_values_of(name: str, node: dict, key: str, problems: list[ConfigProblem]) -> None:
    try:
        obj = import_component(name, _join(key, COMPONENT_KEY))
        signature = inspect.signature(obj)
    except Exception:  # noqa: BLE001 - a component that does not import is reported by the component check
        return
    hints = _type_hints(obj)
    P = inspect.Parameter
    params = signature.parameters
    extra = [p for p in params.values() if p.kind == P.VAR_KEYWORD]
    for arg, value in node.items():
        if arg == COMPONENT_KEY or value is _UNRESOLVED:
            continue
        arg_key = _join(key, arg)
        param = params.get(arg)
        if param is None or param.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL):
            if extra and extra[0].name == "load_dataset_kwargs":
                _check_dataset_option(name, node, arg, arg_key, value, problems)
            continue
        if arg == "lr" and isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            problems.append(ConfigProblem(arg_key, "must be a learning rate >= 0", value))
            continue
        hint = hints.get(arg, inspect.Parameter.empty)
        if value is None and param.default is None:
            continue  # `x: int = None`: null means the default
        if not _fits(value, hint):
            expected = _describe(hint)
            message = f"must be {expected} (argument {arg!r} of {name}); got a {_yaml_type(value)}"
            problems.append(ConfigProblem(arg_key, message, value))
    _check_shards(node, key, problems)


def _type_hints(obj: Any) -> dict[str, Any]:
    import typing

    target = obj.__init__ if isinstance(obj, type) else obj
    try:
        found = inspect.signature(obj).parameters.items()
    except (TypeError, ValueError):
        found = ()
    # the signature's own annotations, where it has them: a builder made by a decorator (the LoRA builders) or
    # wrapped with functools.wraps shows its parameters through __signature__ / __wrapped__ only
    plain = {n: p.annotation for n, p in found if p.annotation is not p.empty and not isinstance(p.annotation, str)}
    try:
        return {**plain, **typing.get_type_hints(target)}
    except Exception:  # noqa: BLE001 - a forward reference that does not resolve: the plain annotations
        return plain


def _fits(value: Any, hint: Any) -> bool:
    """Whether a YAML value can be the argument annotated ``hint`` (True for types that cannot be told)."""
    import collections.abc
    import types
    import typing

    if hint is inspect.Parameter.empty or hint is Any:
        return True
    if isinstance(value, dict) and COMPONENT_KEY in value:
        return True  # built at run time
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in typing.get_args(hint))
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    if base in (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence):
        return isinstance(value, list) or (base is collections.abc.Sequence and isinstance(value, str))
    if base in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return isinstance(value, dict)
    if getattr(hint, "__module__", "") == "torch" and getattr(hint, "__name__", "") == "Tensor":
        return False  # a YAML value is never a tensor (`lr: float | Tensor`)
    return True  # a class, a callable, ...: not checked here


def _describe(hint: Any) -> str:
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(arg) for arg in typing.get_args(hint)))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    base = origin or hint
    if base in (list, tuple) or getattr(base, "__name__", "") in ("Sequence", "MutableSequence"):
        return "a list"
    if base is dict or getattr(base, "__name__", "") in ("Mapping", "MutableMapping"):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _yaml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return "null" if value is None else type(value).__name__


def _check_dataset_option(name: str, node: dict, arg: str, key: str, value: Any, problems: list[ConfigProblem]) -> None:
    """An argument that a dataset builder passes on to ``datasets.load_dataset``: one of its arguments, or an
    option of the builder that reads ``source`` (``json``: ``field``, ``encoding``, ...)."""
    source = node.get("source")
    accepted = _load_dataset_options(source if isinstance(source, str) else None)
    if accepted is None or arg in accepted:
        return
    own = [n for n, p in inspect.signature(import_component(name, key)).parameters.items() if p.kind != p.VAR_KEYWORD]
    close = difflib.get_close_matches(arg, own + sorted(accepted), n=1)
    hint = f"; did you mean {close[0]}?" if close else "; remove it or fix its name"
    reader = f"datasets.load_dataset({source!r})" if isinstance(source, str) else "datasets.load_dataset"
    problems.append(ConfigProblem(key, f"is not an option of {name} nor of {reader}{hint}", value))


def _load_dataset_options(source: str | None) -> set[str] | None:
    """The keyword arguments ``datasets.load_dataset(source, ...)`` takes; None when they cannot be told."""
    import dataclasses
    import importlib

    try:
        import datasets
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except Exception:  # noqa: BLE001 - without `datasets` the recipe reports the missing package
        return None
    own = set(inspect.signature(datasets.load_dataset).parameters) - {"path", "config_kwargs"}
    builders = [source] if source in _PACKAGED_DATASETS_MODULES else list(_HUB_BUILDERS)
    for builder in builders:
        try:
            module = importlib.import_module(_PACKAGED_DATASETS_MODULES[builder][0])
        except Exception:  # noqa: BLE001 - an optional dependency of one builder: its options are not known
            return None
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, datasets.BuilderConfig) and dataclasses.is_dataclass(obj):
                own.update(f.name for f in dataclasses.fields(obj))
    return own


def _check_shards(node: dict, key: str, problems: list[ConfigProblem]) -> None:
    """``checkpoint_files`` given as a list names every shard of the checkpoint's index file."""
    import json

    files, directory = node.get("checkpoint_files"), node.get("checkpoint_dir")
    if not isinstance(files, list) or not isinstance(directory, str) or not files:
        return
    for index_name in _INDEX_FILES:
        index = Path(directory) / index_name
        if not index.is_file():
            continue
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            return  # the checkpointer reports a broken index when it reads it
        needed = {f for f in weight_map.values() if isinstance(f, str)}
        if not needed or not all(Path(f).suffix == Path(next(iter(needed))).suffix for f in files):
            continue  # the files are of the other format (bin vs safetensors)
        missing = sorted(needed - {str(f) for f in files})
        if missing:
            message = (
                f"misses {len(missing)} shard(s) that {index} names: {', '.join(missing)}; "
                "list every shard, or remove checkpoint_files to read them from the index"
            )
            problems.append(ConfigProblem(_join(key, "checkpoint_files"), message, files))
        return
