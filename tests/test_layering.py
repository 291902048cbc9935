"""Enforces the import rules of shared/DESIGN.md ("Layering") by walking every import in tune/ and recipes/.

Each module of tune/ belongs to a layer (its package below ``tune``). A layer may import only the layers listed
for it. Optional dependencies may only be imported lazily (inside a function), never at module level. Imports by
name at run time count too: ``importlib.import_module("tune.x.y")``, ``import_module(f"tune.x.{name}")`` and
``__import__("tune.x")`` with a literal name (or the literal prefix of an f-string) import layer ``x``.
"""

import ast
import sys
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
    "models": {"modules", "modules.peft", "data", "utils", "registry", "plugins"},
    "training": {"modules", "modules.peft", "data", "utils", "registry", "plugins"},
    # torchtune's CheckpointClient, at torchtune's path (the one exception to "training never imports config"):
    # it builds the checkpointer a recipe config names
    "training.checkpoint_client": {"training", "config", "modules", "modules.peft", "data", "utils", "registry"},
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
# statement). The registry finds the built-in model families itself: at lookup time it imports `tune.models` and
# `tune.models.<family>` by name, so importing the registry imports no family, while the families import the
# registry for the `ModelFamily` they declare and nothing else from it (checked below), and never the registry's
# users (training, config, _cli: not in ALLOWED["models"]).
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
    if parts[1:4] == ["training", "checkpointing", "_checkpoint_client"]:
        return "training.checkpoint_client"
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
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
