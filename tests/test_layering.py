"""Enforces the import rules of shared/DESIGN.md ("Layering") by walking every import in tune/ and recipes/.

Each module of tune/ belongs to a layer (its package below ``tune``). A layer may import only the layers listed
for it. Optional dependencies may only be imported lazily (inside a function), never at module level.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tune"

# layer -> layers it may import (itself always allowed). `registry` and `plugins` are leaves like `utils`.
ALLOWED = {
    "utils": set(),
    "plugins": set(),
    "registry": {"plugins", "utils"},
    "recipe_interfaces": set(),
    "modules": {"utils"},
    "modules.peft": {"modules", "utils"},
    "data": {"utils"},
    "datasets": {"data", "utils"},
    "models": {"modules", "modules.peft", "data", "utils", "registry", "plugins"},
    "training": {"modules", "modules.peft", "data", "utils", "registry", "plugins"},
    "generation": {"modules", "data", "utils"},
    "config": {"utils", "plugins", "registry"},
    # the CLI is the top of the library: it may use any layer (never recipes, checked separately)
    "_cli": {"config", "utils", "plugins", "registry", "recipe_interfaces", "data", "datasets", "models",
             "modules", "modules.peft", "training", "generation"},
    "__init__": set(),
}
THIRD_PARTY_UTILS = {"torch"}  # tune.utils imports only the standard library and torch
OPTIONAL = {"wandb", "tensorboard", "lm_eval", "torchao", "transformers", "peft"}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if parts[1] == "modules" and len(parts) > 2 and parts[2] == "peft":
        return "modules.peft"
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_pkg: bool):
    """Yields (imported module, line, at_module_level)."""
    top_level = {id(n) for n in tree.body} if isinstance(tree, ast.Module) else set()
    # nodes inside `if TYPE_CHECKING:` are treated as not imported at run time
    type_checking = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        level = id(node) in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, level
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno, level
            for alias in node.names:  # `from tune import models` imports tune.models
                if target == "tune" and not alias.name.startswith("__"):
                    yield f"tune.{alias.name}", node.lineno, level


def _python_files(base: Path):
    return sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def test_tune_layers_import_only_what_design_allows():
    violations = []
    files = _python_files(PKG)
    assert len(files) > 10
    for path in files:
        module = _module_name(path)
        layer = _layer(module)
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line, at_top in _imports(tree, module, path.name == "__init__.py"):
            root = target.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}"
            if root == "recipes":
                violations.append(f"{where}: tune/ imports recipes ({target})")
            if at_top and root in OPTIONAL:
                violations.append(f"{where}: optional dependency {target} imported at module level")
            if layer == "utils" and root not in THIRD_PARTY_UTILS and root != "tune":
                if root not in sys.stdlib_module_names:
                    violations.append(f"{where}: tune.utils imports third-party {target}")
            if root != "tune" or target == "tune":
                continue
            target_layer = _layer(target)
            if target_layer == layer or layer in ("__init__",):
                continue
            if target_layer not in ALLOWED[layer] and not (layer == "modules.peft" and target_layer == "modules"):
                violations.append(f"{where}: layer {layer!r} may not import {target} (layer {target_layer!r})")
            # families are independent: another family only through its public __init__
            if layer == "models" and target_layer == "models":
                pass
        if layer == "models":
            own = module.split(".")[2] if len(module.split(".")) > 2 else None
            for target, line, _ in _imports(tree, module, path.name == "__init__.py"):
                parts = target.split(".")
                if len(parts) > 3 and parts[:2] == ["tune", "models"] and parts[2] != own and own is not None:
                    if any(p.startswith("_") for p in parts[3:]):
                        violations.append(
                            f"{path.relative_to(ROOT)}:{line}: family {own!r} imports private {target}; "
                            f"use the public tune.models.{parts[2]} instead"
                        )
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_recipes_import_only_public_tune_names():
    violations = []
    for path in _python_files(ROOT / "recipes"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line, _ in _imports(tree, "recipes." + path.stem, False):
            parts = target.split(".")
            if parts[0] == "tune" and any(p.startswith("_") for p in parts[1:]):
                violations.append(f"{path.relative_to(ROOT)}:{line}: private import {target}")
            if parts[0] == "recipes":
                violations.append(f"{path.relative_to(ROOT)}:{line}: a recipe imports another recipe ({target})")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize(
    "source, layer, expected",
    [
        ("from tune.models import llama3", "modules", True),
        ("from tune.utils import get_logger", "modules", False),
        ("import transformers", "training", True),
    ],
)
def test_layering_checker_catches_violations(tmp_path, source, layer, expected):
    # the checker itself must be able to fail: feed it one known-bad and one known-good import
    tree = ast.parse(source)
    found = []
    for target, _, at_top in _imports(tree, f"tune.{layer}.x", False):
        root = target.split(".")[0]
        if at_top and root in OPTIONAL:
            found.append(target)
        elif root == "tune" and _layer(target) != layer and _layer(target) not in ALLOWED[layer]:
            found.append(target)
    assert bool(found) == expected
