"""Enforces the import rules of docs/architecture.md ("Layering") by walking every import in tune/ and recipes/.

Each module of tune/ belongs to a layer (its package below ``tune``). A layer may import only the layers listed
for it. Optional dependencies may only be imported lazily (inside a function), never at module level. Imports by
name at run time count too: ``importlib.import_module("tune.x.y")``, ``import_module(f"tune.x.{name}")`` and
``__import__("tune.x")`` with a literal name (or the literal prefix of an f-string) import layer ``x``.

Besides the layers: tune's import graph has no cycle but the one the registry's by-name lookup of a family closes
(the one import that runs back up a layer); model families never reach the registry's lookups; and no public
module is a twin re-exporting a private one.
"""

import ast
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tune"

# layer -> layers it may import (itself always allowed), statically or by name at run time. `registry` and
# `plugins` are leaves like `utils`: importing them imports no other layer.
ALLOWED = {
    "utils": set(),
    "plugins": set(),
    "registry": {"plugins", "utils"},
    "recipe_interfaces": set(),
    "modules": {"utils"},
    "modules.peft": {"modules", "utils"},
    # torchtune's path for tune.data's tokenizers (an alias layer, the one exception to "modules imports utils")
    "modules.transforms": {"modules", "data", "utils"},
    "data": {"utils"},
    "datasets": {"data", "utils"},
    # modules.transforms too: the vision families' image transforms build on its vision_utils and
    # VisionCrossAttentionMask (torchtune's paths); it imports only layers models may import themselves
    "models": {"modules", "modules.peft", "modules.transforms", "data", "utils", "registry", "plugins"},
    "training": {"modules", "modules.peft", "data", "utils", "registry", "plugins"},
    "generation": {"modules", "data", "utils"},
    # preference and RL fine-tuning math (torchtune's torchtune.rlhf): losses, log-probabilities, metrics
    "rlhf": {"modules", "modules.peft", "data", "utils"},
    # config reads a recipe's policy from its config (tune/config/_training.py): checks and builds with training
    # and data components; those never import config
    "config": {"utils", "plugins", "registry", "training", "data", "modules", "modules.peft"},
    # the CLI is the top of the library: it may use any layer (never recipes, checked separately)
    "_cli": {
        "config",
        "utils",
        "plugins",
        "registry",
        "recipe_interfaces",
        "data",
        "datasets",
        "models",
        "modules",
        "modules.peft",
        "training",
        "generation",
    },
    "__init__": set(),
}
# layer -> layers it may import only by name, inside a function (never at module level, never with an import
# statement). The registry finds the built-in model families itself: at lookup time it imports
# `tune.models.<family>` by name (the one upward arrow in tune), so importing the registry imports no family,
# while the families import the registry for the `ModelFamily` they declare and nothing else from it (checked
# below), never reach its lookups through a helper (test_model_families_never_reach_registry_lookups), and never
# import the registry's users (training, config, _cli: not in ALLOWED["models"]).
BY_NAME_AT_RUN_TIME = {"registry": {"models"}}
# what a family module (tune/models/<family>/...) may take from tune.registry: the declaration, not the lookups
FAMILY_MAY_USE_FROM_REGISTRY = {"ModelFamily", "StateDictConverter", "AdapterConverter", "TorchtuneLayout"}
THIRD_PARTY_UTILS = {"torch"}  # tune.utils imports only the standard library and torch
OPTIONAL = {"wandb", "tensorboard", "lm_eval", "torchao", "transformers", "peft"}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if parts[1] == "modules" and len(parts) > 2 and parts[2] == "peft":
        return "modules.peft"
    if parts[1] == "modules" and len(parts) > 2 and parts[2] == "transforms":
        return "modules.transforms"
    return parts[1]


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _by_name(call: ast.Call) -> str | None:
    """The module a literal ``importlib.import_module(...)`` / ``__import__(...)`` call imports, else None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        target = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        # f"tune.models.{name}" imports a module of tune.models: keep the literal prefix up to its last dot
        target = str(arg.values[0].value).rpartition(".")[0]
    else:
        return None
    return target if target and not target.startswith(".") else None


def _imports(tree: ast.AST, module: str, is_pkg: bool):
    """Yields (imported module, line, at_module_level, by_name).

    ``at_module_level`` is true for an import statement directly in the module body, and for a by-name import
    anywhere outside a function; ``by_name`` is true for ``importlib.import_module``/``__import__`` calls.
    """
    top_level = {id(n) for n in tree.body} if isinstance(tree, ast.Module) else set()
    # nodes inside `if TYPE_CHECKING:` are treated as not imported at run time
    type_checking = set()
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        level = id(node) in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, level, False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno, level, False
            for alias in node.names:  # `from tune import models` imports tune.models
                if target == "tune" and not alias.name.startswith("__"):
                    yield f"tune.{alias.name}", node.lineno, level, False
        elif isinstance(node, ast.Call) and (target := _by_name(node)) is not None:
            yield target, node.lineno, id(node) not in in_function, True


def _family(module: str) -> str | None:
    """The model family a module of tune.models belongs to (``tune.models.llama2._tokenizer`` -> llama2)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[:2] == ["tune", "models"] and not parts[2].startswith("_"):
        return parts[2]
    return None


def _violations(tree: ast.AST, module: str, is_pkg: bool, where: str) -> list[str]:
    """Every layering rule ``module`` (its source parsed as ``tree``) breaks, each prefixed by ``where:line``."""
    found = []
    layer = _layer(module)
    own = _family(module)
    for target, line, at_top, by_name in _imports(tree, module, is_pkg):
        root = target.split(".")[0]
        at = f"{where}:{line}"
        if root == "recipes":
            found.append(f"{at}: tune/ imports recipes ({target})")
        if at_top and root in OPTIONAL:
            found.append(f"{at}: optional dependency {target} imported at module level")
        if layer == "utils" and root not in THIRD_PARTY_UTILS and root != "tune":
            if root not in sys.stdlib_module_names:
                found.append(f"{at}: tune.utils imports third-party {target}")
        if root != "tune" or target == "tune":
            continue
        target_layer = _layer(target)
        if target_layer == layer or layer == "__init__":
            pass
        elif target_layer in BY_NAME_AT_RUN_TIME.get(layer, set()):
            if not by_name or at_top:
                found.append(
                    f"{at}: layer {layer!r} may import {target} only by name inside a function "
                    "(importlib.import_module), never at module level or with an import statement"
                )
        elif target_layer not in ALLOWED[layer]:
            how = " by name" if by_name else ""
            found.append(f"{at}: layer {layer!r} may not import {target}{how} (layer {target_layer!r})")
        # families are independent: another family only through its public __init__
        parts = target.split(".")
        other = _family(target)
        if own is not None and other is not None and other != own and any(p.startswith("_") for p in parts[3:]):
            found.append(f"{at}: family {own!r} imports private {target}; use the public tune.models.{other} instead")
    if own is not None:
        # families declare themselves (FAMILY = ModelFamily(...)); they never look families up or register
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module == "tune.registry":
                names = [a.name for a in node.names if a.name not in FAMILY_MAY_USE_FROM_REGISTRY]
            elif isinstance(node, ast.ImportFrom) and node.module == "tune":
                names = [f"tune.{a.name}" for a in node.names if a.name == "registry"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name == "tune.registry"]
            if names:
                found.append(
                    f"{where}:{node.lineno}: family {own!r} uses {', '.join(names)} from tune.registry; a family "
                    f"only declares `FAMILY = ModelFamily(...)` (may import: {sorted(FAMILY_MAY_USE_FROM_REGISTRY)})"
                )
    return found


def _python_files(base: Path):
    return sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def test_tune_layers_import_only_what_design_allows():
    violations = []
    files = _python_files(PKG)
    assert len(files) > 10
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        where = str(path.relative_to(ROOT))
        violations += _violations(tree, _module_name(path), path.name == "__init__.py", where)
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_recipes_import_only_public_tune_names():
    violations = []
    for path in _python_files(ROOT / "recipes"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line, _, _ in _imports(tree, "recipes." + path.stem, False):
            parts = target.split(".")
            if parts[0] == "tune" and any(p.startswith("_") for p in parts[1:]):
                violations.append(f"{path.relative_to(ROOT)}:{line}: private import {target}")
            if parts[0] == "recipes":
                violations.append(f"{path.relative_to(ROOT)}:{line}: a recipe imports another recipe ({target})")
    assert not violations, "\n".join(violations)


FUNCTION = "def lookup(name):\n    {}\n"


@pytest.mark.parametrize(
    "source, module, expected",
    [
        ("from tune.models import llama3", "tune.modules.x", True),
        ("from tune.utils import get_logger", "tune.modules.x", False),
        ("import transformers", "tune.training.x", True),
        (FUNCTION.format("import transformers"), "tune.training.x", False),
        # by name: a literal, an f-string's literal prefix, __import__
        ("importlib.import_module('tune.models.llama3')", "tune.modules.x", True),
        (FUNCTION.format("import_module(f'tune.training.{name}')"), "tune.data.x", True),
        (FUNCTION.format("__import__('tune.config')"), "tune.models.x", True),
        (FUNCTION.format("importlib.import_module(name)"), "tune.data.x", False),  # not a literal: not seen
        ("importlib.import_module('wandb')", "tune.training.x", True),
        # the registry finds families by name inside a function, never at module level or statically
        (FUNCTION.format("importlib.import_module(f'tune.models.{name}')"), "tune.registry", False),
        ("importlib.import_module('tune.models')", "tune.registry", True),
        (FUNCTION.format("import tune.models"), "tune.registry", True),
        (FUNCTION.format("importlib.import_module('tune.training')"), "tune.registry", True),
        # families declare themselves and use each other's public __init__ only
        ("from tune.registry import ModelFamily", "tune.models.llama2", False),
        ("from tune.registry import ModelFamily, register_model_family", "tune.models.llama2", True),
        ("from tune import registry", "tune.models.llama2._convert_weights", True),
        ("from tune.models.llama2 import llama2", "tune.models.llama3", False),
        ("from tune.models.llama2._component_builders import llama2", "tune.models.llama3", True),
        (FUNCTION.format("import_module('tune.models.llama2._tokenizer')"), "tune.models.llama3", True),
    ],
)
def test_layering_checker_catches_violations(source, module, expected):
    # the checker itself must be able to fail: feed it known-bad and known-good imports
    found = _violations(ast.parse(source), module, False, "<test>")
    assert bool(found) == expected, found


# ------------------------------------------------------------------------------------------------ import cycles
# The one edge allowed to close a cycle: tune.registry imports a built-in family by name, inside a function, the
# first time a lookup asks for it (`importlib.import_module(f"tune.models.{name}")` in `_load_builtin`). Every
# family imports tune.registry for its declaration (`FAMILY = ModelFamily(...)`), so that edge closes
# tune.registry -> tune.models.<family> -> tune.registry by design. No other import, of any kind, may close one.
def _is_registry_family_lookup(source: str, target: str, by_name: bool, in_function: bool, root: Path = ROOT) -> bool:
    parts = target.split(".")
    return (
        source == "tune.registry"
        and by_name
        and in_function
        and len(parts) == 3
        and parts[:2] == ["tune", "models"]
        and _family(target) is not None
        and (root / "tune" / "models" / parts[2] / "__init__.py").is_file()
    )


def _graph_edges(tree: ast.AST, module: str, is_pkg: bool, modules: set[str]):
    """Yields (imported tune module, line, by_name, in_function) for every import of ``tree``: module level,
    inside a function and under ``TYPE_CHECKING`` alike (a type-only import still ties two modules together).

    ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``; ``import a.b.c`` imports the
    longest prefix that is a module of tune; a by-name import of an f-string (``f"tune.models.{name}"``) imports
    every public module directly under its literal prefix (names built at run time are public ones: families,
    subpackages).
    """
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):
        inside = id(node) in in_function
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := known(alias.name)) is not None:
                    yield target, node.lineno, False, inside
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                package = ".".join(base + ([node.module] if node.module else []))
            else:
                package = node.module or ""
            for alias in node.names:
                target = f"{package}.{alias.name}" if f"{package}.{alias.name}" in modules else known(package)
                if target is not None:
                    yield target, node.lineno, False, inside
        elif isinstance(node, ast.Call) and (target := _by_name(node)) is not None:
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr):  # every module the f-string can name
                children = (m for m in modules if m.rpartition(".")[0] == target)
                for child in sorted(c for c in children if not c.rpartition(".")[2].startswith("_")):
                    yield child, node.lineno, True, inside
            elif (found := known(target)) is not None:
                yield found, node.lineno, True, inside


def _import_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """The import graph of ``root/tune``: module -> {module it imports: where}, without the registry's by-name
    family lookups."""
    files = {_module_name(path, root): path for path in _python_files(root / "tune")}
    graph: dict[str, dict[str, list[str]]] = {module: {} for module in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line, by_name, inside in _graph_edges(tree, module, path.name == "__init__.py", set(files)):
            if target != module and not _is_registry_family_lookup(module, target, by_name, inside, root):
                where = f"{path.relative_to(root)}:{line}{' by name' if by_name else ''}"
                if where not in graph[module].setdefault(target, []):
                    graph[module][target].append(where)
    return graph


def _cycles(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected component of
    ``graph`` that has more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:
        # the shortest way from the component's first module back to itself, staying inside the component
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for successor in sorted(graph[node]):
                if successor == start:
                    cycles.append([*paths[node], start])
                    queue = []
                    break
                if successor in component and successor not in paths:
                    paths[successor] = [*paths[node], successor]
                    queue.append(successor)
    return sorted(cycles)


def _describe(cycle: list[str], graph: dict[str, dict[str, list[str]]]) -> str:
    steps = [f"{a} -> {b}  [{', '.join(sorted(graph[a][b]))}]" for a, b in zip(cycle, cycle[1:])]
    return "\n    ".join(steps)


def test_tune_has_no_import_cycle():
    graph = _import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300, "the walk found too few imports"
    cycles = _cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s) in tune/:\n  " + "\n  ".join(
        _describe(cycle, graph) for cycle in cycles
    )


def _routes_from_families_to_registry(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """For each module of a family that reaches ``tune.registry``, the shortest route, not counting the one import
    a family makes of it: its package's ``__init__`` importing the declaration (``ModelFamily``, ...).

    ``tune.models._from_hf`` (``from_hf``) imports the registry, so a route to it is found as well.
    """
    routes = []
    for start in sorted(m for m in graph if _family(m) is not None):
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            declaration = _family(node) is not None and node.count(".") == 2  # tune.models.<family> itself
            for successor in sorted(graph[node]):
                if successor in paths or (declaration and successor == "tune.registry"):
                    continue
                paths[successor] = [*paths[node], successor]
                queue.append(successor)
        if "tune.registry" in paths:
            routes.append(paths["tune.registry"])
    return routes


def test_model_families_never_reach_registry_lookups():
    # a family declares itself and is looked up; it never looks families up, not even through a shared helper
    # (module level, in a function or by name): the registry's lookups and from_hf sit above the families
    graph = _import_graph()
    routes = _routes_from_families_to_registry(graph)
    assert not routes, "model families reach tune.registry:\n  " + "\n  ".join(
        _describe(route, graph) for route in routes[:5]
    )


def test_cycle_finder_sees_lazy_type_only_and_by_name_imports():
    modules = {"tune.a", "tune.b", "tune.registry", "tune.models", "tune.models.llama2"}
    lazy = "def f():\n    from tune import b\n"
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tune.a import x\n"
    by_name = "import importlib\ndef f(n):\n    importlib.import_module(f'tune.models.{n}')\n"
    assert [e[0] for e in _graph_edges(ast.parse(lazy), "tune.a", False, modules)] == ["tune.b"]
    assert [e[0] for e in _graph_edges(ast.parse(type_only), "tune.b", False, modules)] == ["tune.a"]
    assert list(_graph_edges(ast.parse(by_name), "tune.registry", False, modules)) == [
        ("tune.models.llama2", 3, True, True)
    ]
    assert _cycles({"tune.a": {"tune.b": ""}, "tune.b": {"tune.a": ""}}) == [["tune.a", "tune.b", "tune.a"]]
    assert _cycles({"tune.a": {"tune.b": ""}, "tune.b": {}}) == []
    # the registry's lookup of a family is the one edge left out; its literal import of tune.models is not
    assert _is_registry_family_lookup("tune.registry", "tune.models.llama2", by_name=True, in_function=True)
    assert not _is_registry_family_lookup("tune.registry", "tune.models", by_name=True, in_function=True)
    assert not _is_registry_family_lookup("tune.registry", "tune.models.llama2", by_name=False, in_function=True)
    assert not _is_registry_family_lookup("tune.models._hf", "tune.models.llama2", by_name=True, in_function=True)
    # a family's declaration import is no route to the lookups; one through a helper is
    declared = {"tune.models.llama2": {"tune.registry": []}, "tune.registry": {}}
    assert _routes_from_families_to_registry(declared) == []
    helper = {**declared, "tune.models.llama2._x": {"tune.models._hf": []}, "tune.models._hf": {"tune.registry": []}}
    assert _routes_from_families_to_registry(helper) == [["tune.models.llama2._x", "tune.models._hf", "tune.registry"]]


def _public_twins(base: Path) -> list[str]:
    """Public modules (``x.py``) that sit next to a private module of the same name (``_x.py``)."""
    return sorted(
        str(path.relative_to(base))
        for path in _python_files(base)
        if not path.name.startswith("_") and (path.parent / f"_{path.name}").is_file()
    )


def test_a_public_module_is_the_real_module():
    # a public module holds its code, not a few lines re-exporting a private twin
    assert _public_twins(PKG) == []


def test_twin_finder_finds_twins(tmp_path):
    (tmp_path / "seed.py").write_text("from _seed import set_seed\n")
    (tmp_path / "_seed.py").write_text("def set_seed(): ...\n")
    (tmp_path / "memory.py").write_text("")
    assert _public_twins(tmp_path) == ["seed.py"]
