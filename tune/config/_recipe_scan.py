"""Reads what a recipe does with its config from the recipe's source (``ast``), without importing or running it.

Two facts matter to ``tune validate``:

- the keys the recipe reads (``cfg.optimizer.lr``, ``cfg_dataset.packed`` where ``cfg_dataset`` came from
  ``cfg.dataset``): the config must have them. Reads through ``cfg.get(...)``, ``"k" in cfg`` or under
  ``if cfg.get("k")`` are optional and not required;
- the arguments the recipe adds when it instantiates a node (``instantiate(cfg.optimizer, params)`` gives
  ``optimizer`` one positional argument; ``instantiate(cfg_dataset, tokenizer=tok)`` gives ``dataset`` the
  keyword ``tokenizer``): the config need not (and must not) supply them.

Config nodes reach helper methods under other names (``self._setup_data(cfg_dataset=cfg.dataset)``). The scan
follows assignments, calls of functions defined in the same file, and ``for`` loops over config lists; a name
``cfg_<key>`` it cannot trace is taken to mean ``cfg.<key>``, the convention recipes follow.
"""

import ast
import copy
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tune.config._files import file_version

# a path below the config root; "*" stands for every item of a list
KeyPath = tuple[str, ...]
_CFG_NAME = "cfg"
_CFG_PREFIX = re.compile(r"^cfg_(\w+)$")
_MAX_PASSES = 6


@dataclass
class RuntimeArgs:
    """Arguments a recipe adds when it instantiates one config node.

    Args:
        num_positional (int): positional arguments passed after the node.
        keywords (set[str]): keyword arguments passed.
        open_ended (bool): ``*args`` or ``**kwargs`` at the call: any argument may arrive.
    """

    num_positional: int = 0
    keywords: set[str] = field(default_factory=set)
    open_ended: bool = False

    def merge(self, other: "RuntimeArgs") -> None:
        self.num_positional = max(self.num_positional, other.num_positional)
        self.keywords |= other.keywords
        self.open_ended = self.open_ended or other.open_ended


@dataclass
class RecipeScan:
    """What :func:`scan_recipe` found.

    Args:
        path (Path): the recipe file.
        reads (dict[KeyPath, int]): keys the recipe reads unconditionally -> first line.
        mentioned (set[str]): every top-level key the recipe refers to at all (read, read optionally with
            ``cfg.get``, or checked for presence): the keys a config for it may have.
        runtime_args (dict[KeyPath, RuntimeArgs]): nodes the recipe instantiates -> arguments it adds.
        definitions (dict[str, inspect.Signature | None]): functions and classes defined at module level, with
            their signatures (``None`` when it cannot be read from the source).
        imports (dict[str, str]): module-level ``from x import y as z`` names -> ``x.y``.
    """

    path: Path
    reads: dict[KeyPath, int] = field(default_factory=dict)
    mentioned: set[str] = field(default_factory=set)
    runtime_args: dict[KeyPath, RuntimeArgs] = field(default_factory=dict)
    definitions: dict[str, inspect.Signature | None] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)


# tune.config helpers that instantiate the node passed first, and the arguments they give it (keywords they pass
# only when the component takes them and the config does not set them count as passed)
_INSTANTIATING_HELPERS = {
    "instantiate_lr_scheduler": RuntimeArgs(num_positional=1, keywords={"num_training_steps"}),
    "instantiate_tensor_parallel_plan": RuntimeArgs(keywords={"model"}),
    "instantiate_collate": RuntimeArgs(),
    "instantiate_dataset": RuntimeArgs(num_positional=1),
}

# an expression that refers to a config node: its path, and whether it came through an optional lookup
_Ref = tuple[KeyPath, bool]


def scan_recipe(path: str | Path) -> RecipeScan:
    """Scans a recipe file for the config keys it reads and the arguments it passes to ``instantiate``.

    Args:
        path (str | Path): the recipe script.

    Returns:
        RecipeScan: the findings.

    Raises:
        SyntaxError: when the file does not parse.
    """
    path = Path(path)
    key = file_version(path)
    if key not in _SCAN_CACHE:
        _SCAN_CACHE[key] = _scan(path)
    return copy.deepcopy(_SCAN_CACHE[key])


_SCAN_CACHE: dict[tuple, "RecipeScan"] = {}  # one scan per version of a recipe file (tune.config._files)


def _scan(path: Path) -> RecipeScan:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    scanner = _Scanner(tree)
    scanner.trace_aliases()
    scan = RecipeScan(path=path)
    scanner.collect_instantiations(scan)
    _Reads(scanner, scan).visit(tree)
    _collect_definitions(tree, scan)
    return scan


class _Scanner:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.aliases: dict[str, set[_Ref]] = {_CFG_NAME: {((), False)}}
        # function name -> (positional parameter names, all parameter names) of each def of that name
        self.functions: dict[str, list[tuple[list[str], list[str]]]] = {}
        for parent in ast.walk(tree):
            body = getattr(parent, "body", [])
            for node in body if isinstance(body, list) else []:  # a lambda's body is one expression
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [a.arg for a in node.args.posonlyargs + node.args.args]
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
                    if isinstance(parent, ast.ClassDef) and not static:
                        names = names[1:]  # self / cls
                    keyword_only = [a.arg for a in node.args.kwonlyargs]
                    self.functions.setdefault(node.name, []).append((names, names + keyword_only))

    def refs(self, expr: ast.AST) -> set[_Ref]:
        """The config paths ``expr`` may refer to."""
        if isinstance(expr, ast.Name):
            if expr.id in self.aliases:
                return self.aliases[expr.id]
            match = _CFG_PREFIX.match(expr.id)
            return {((match.group(1),), False)} if match else set()
        if isinstance(expr, ast.Attribute):
            name = _self_attr(expr)
            if name is not None and name in self.aliases:
                return self.aliases[name]
            return {(p + (expr.attr,), opt) for p, opt in self.refs(expr.value)}
        if isinstance(expr, ast.Subscript):
            key = _subscript_key(expr)
            return {(p + (key,), opt) for p, opt in self.refs(expr.value)} if key else set()
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get":
            key = _const_str(expr.args[0]) if expr.args else None
            return {(p + (key,), True) for p, _ in self.refs(expr.func.value)} if key else set()
        return set()

    def guard_map(self) -> dict[int, frozenset[KeyPath]]:
        """For each call, assignment and loop: the paths guarded (checked for presence) where it runs."""
        found: dict[int, frozenset[KeyPath]] = {}

        def walk(node: ast.AST, guards: frozenset[KeyPath]) -> None:
            if isinstance(node, (ast.Call, ast.Assign, ast.For, ast.AsyncFor)):
                found[id(node)] = guards
            if isinstance(node, (ast.If, ast.IfExp)):
                walk(node.test, guards)
                body = node.body if isinstance(node.body, list) else [node.body]
                orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
                for child in body:
                    walk(child, guards | self.guards(node.test))
                for child in orelse:
                    walk(child, guards)
                return
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
                for value in node.values:
                    walk(value, guards)
                    guards = guards | self.guards(value)
                return
            for child in ast.iter_child_nodes(node):
                walk(child, guards)

        walk(self.tree, frozenset())
        return found

    def guards(self, test: ast.AST) -> set[KeyPath]:
        """Config paths a condition checks for presence (`cfg.get("k")`, `"k" in cfg`, `hasattr(cfg, "k")`)."""
        guards = set()
        for node in ast.walk(test):
            if isinstance(node, ast.Call) and _called_name(node) in ("get", "hasattr", "select"):
                if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
                    key, base = _const_str(node.args[0]), node.func.value
                elif len(node.args) >= 2:  # hasattr(cfg, "k"), OmegaConf.select(cfg, "k")
                    key, base = _const_str(node.args[1]), node.args[0]
                else:
                    continue
                if key:
                    guards |= {p + tuple(key.split(".")) for p, _ in self.refs(base)}
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                key = _const_str(node.left)
                if key:
                    guards |= {p + (key,) for c in node.comparators for p, _ in self.refs(c)}
        return guards

    def trace_aliases(self) -> None:
        for _ in range(_MAX_PASSES):
            before = sum(len(v) for v in self.aliases.values())
            guard_map = self.guard_map()
            for node in ast.walk(self.tree):
                guards = guard_map.get(id(node), frozenset())
                if isinstance(node, ast.Assign):
                    refs = self._refs_under(node.value, guards)
                    for target in node.targets:
                        self._alias(_target_name(target), refs)
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    refs = {(p + ("*",), opt) for p, opt in self._refs_under(node.iter, guards)}
                    self._alias(_target_name(node.target), refs)
                elif isinstance(node, ast.Call):
                    self._alias_call(node, guards)
            if sum(len(v) for v in self.aliases.values()) == before:
                return

    def _alias(self, name: str | None, refs: set[_Ref]) -> None:
        # `cfg` always means the root: a helper `def build(cfg)` called with `cfg.model` must not make every
        # `cfg.x` of the recipe look like `model.x`
        if name is not None and name != _CFG_NAME and refs:
            self.aliases.setdefault(name, set()).update(refs)

    def _refs_under(self, expr: ast.AST, guards: frozenset[KeyPath]) -> set[_Ref]:
        """refs(expr), optional where a guard checked the path: `if cfg.get("v"): setup(cfg.v)`."""
        return {(p, opt or any(p[: len(g)] == g for g in guards)) for p, opt in self.refs(expr)}

    def _alias_call(self, call: ast.Call, guards: frozenset[KeyPath]) -> None:
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        for positional, params in self.functions.get(name, []):
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred) or i >= len(positional):
                    break
                self._alias(positional[i], self._refs_under(arg, guards))
            for keyword in call.keywords:
                if keyword.arg is not None and keyword.arg in params:
                    self._alias(keyword.arg, self._refs_under(keyword.value, guards))

    def collect_instantiations(self, scan: RecipeScan) -> None:
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = _called_name(node)
            if name == "instantiate":
                extra = node.args[1:]
                args = RuntimeArgs(
                    num_positional=sum(1 for a in extra if not isinstance(a, ast.Starred)),
                    keywords={k.arg for k in node.keywords if k.arg is not None},
                    open_ended=any(isinstance(a, ast.Starred) for a in extra)
                    or any(k.arg is None for k in node.keywords),
                )
            elif name in _INSTANTIATING_HELPERS:
                args = _INSTANTIATING_HELPERS[name]
            else:
                continue
            for path, _ in self.refs(node.args[0]):
                scan.runtime_args.setdefault(path, RuntimeArgs()).merge(args)


class _Reads(ast.NodeVisitor):
    """Records chains like ``cfg.a.b`` as required reads, except under a guard that makes them optional."""

    def __init__(self, scanner: _Scanner, scan: RecipeScan):
        self.scanner = scanner
        self.scan = scan
        self.guarded: list[set[KeyPath]] = []

    def _record(self, expr: ast.AST, line: int) -> None:
        for path, optional in self.scanner.refs(expr):
            if path:
                self.scan.mentioned.add(path[0])
            if optional or not path or self._is_guarded(path):
                continue
            self.scan.reads.setdefault(path, line)

    def _mention(self, paths: Iterable[KeyPath]) -> None:
        self.scan.mentioned.update(path[0] for path in paths if path)

    def _is_guarded(self, path: KeyPath) -> bool:
        return any(path[: len(g)] == g for guards in self.guarded for g in guards)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load) and self.scanner.refs(node):
            self._record(node, node.lineno)  # the whole chain; its inner links are prefixes of it
            return
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.scanner.refs(node):
            self._record(node, node.lineno)
            self.visit(node.slice)
            return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and self.scanner.refs(func.value):
            self._mention(path for path, _ in self.scanner.refs(node))  # `cfg.get("k", default)` mentions k
            self._record(func.value, node.lineno)  # `cfg.a.get(...)` reads `a`; `get` is a method, not a key
            for child in [*node.args, *node.keywords]:
                self.visit(child)
            return
        self.generic_visit(node)

    def _guarded_visit(self, guards: set[KeyPath], nodes: list[ast.AST]) -> None:
        self._mention(guards)  # `if "k" in cfg:` mentions k
        self.guarded.append(guards)
        for child in nodes:
            self.visit(child)
        self.guarded.pop()

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._guarded_visit(self.scanner.guards(node.test), node.body)
        for child in node.orelse:
            self.visit(child)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        self._guarded_visit(self.scanner.guards(node.test), [node.body])
        self.visit(node.orelse)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if not isinstance(node.op, ast.And):
            self.generic_visit(node)
            return
        guards: set[KeyPath] = set()
        for value in node.values:  # `cfg.get("x") and cfg.x.y`: later operands run only when earlier ones hold
            self._guarded_visit(set(guards), [value])
            guards |= self.scanner.guards(value)


def _collect_definitions(tree: ast.Module, scan: RecipeScan) -> None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scan.definitions[node.name] = _signature(node.args, drop_first=False)
        elif isinstance(node, ast.ClassDef):
            scan.definitions[node.name] = _class_signature(node)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                scan.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"


def _class_signature(node: ast.ClassDef) -> inspect.Signature | None:
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return _signature(item.args, drop_first=True)
    if node.bases or node.decorator_list:
        return None  # inherited or generated (dataclass) __init__: not readable from this file
    return inspect.Signature()


_DEFAULT = object()  # stands for a default value that exists in the source


def _signature(args: ast.arguments, drop_first: bool) -> inspect.Signature:
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    first_default = len(positional) - len(args.defaults)
    params = [
        P(a.arg, kind, default=_DEFAULT if i >= first_default else P.empty) for i, (a, kind) in enumerate(positional)
    ]
    if drop_first:
        params = params[1:]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if default is None else _DEFAULT))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _subscript_key(node: ast.Subscript) -> str | None:
    if isinstance(node.slice, ast.Constant):
        if isinstance(node.slice.value, str):
            return node.slice.value
        if isinstance(node.slice.value, int):
            return "*"
    return None


def _self_attr(node: ast.Attribute) -> str | None:
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _target_name(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return _self_attr(target)
    return None


def _module_assignment(tree: ast.Module, name: str) -> ast.expr | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


def read_unsupported(path: str | Path) -> dict[str, str]:
    """The ``UNSUPPORTED`` table of a recipe file: key -> reason (a ``KeepDefault(reason)`` gives its reason).

    Raises:
        ValueError: when the table is not a dict of string keys to strings or ``KeepDefault("...")`` calls.
    """
    path = Path(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    value = _module_assignment(tree, "UNSUPPORTED")
    if value is None:
        return {}
    if not isinstance(value, ast.Dict):
        raise ValueError(f"{path}: UNSUPPORTED must be a dict literal, got {ast.unparse(value)[:60]!r}")
    table = {}
    for key, reason in zip(value.keys, value.values, strict=True):
        if isinstance(reason, ast.Call) and reason.args:  # config.KeepDefault("reason")
            reason = reason.args[0]
        try:
            table[ast.literal_eval(key)] = ast.literal_eval(reason)
        except ValueError:
            raise ValueError(
                f"{path}:{key.lineno}: UNSUPPORTED entries must be 'key': 'reason' or 'key': KeepDefault('reason')"
            ) from None
    return table
