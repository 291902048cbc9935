import difflib
import inspect
import re
from collections.abc import Sequence
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
    every config.

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
