"""torchtune 0.6.1's public API against tune's.

Writes tests/assets/torchtune_0_6_1_api.json, every public name of torchtune 0.6.1 with its signature; run once,
with a Python that has torchtune 0.6.1 installed (the peer harness's venv has it):

    /tmp/bench/.venvs/tt/bin/python tools/torchtune_api.py

Checks tune against that file (tune's Python, from the repository root): every name missing from tune or offered
with an incompatible signature, per package (``--package torchtune.training`` for one):

    .venv/bin/python tools/torchtune_api.py --check [--package PACKAGE]

"Public" is a package's ``__all__``, for every package under ``torchtune`` that defines one. Each entry records
what kind of object the name is and, for functions and classes, the parameters of the function or of the class's
``__init__``: name, kind (positional-or-keyword, keyword-only, ...) and the default's ``repr`` (null when there is
none). tests/test_torchtune_api.py reads the file and checks that tune offers each name with a compatible
signature, or lists it in docs/migrating.md. Packages that need optional dependencies torchtune does not declare
(torchvision) are recorded with the error instead of their names.
"""

import enum
import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "assets" / "torchtune_0_6_1_api.json"


def _parameters(obj) -> list[dict] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    params = []
    for index, p in enumerate(signature.parameters.values()):
        if inspect.isclass(obj) and index == 0 and p.name == "self":
            continue
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        params.append({"name": p.name, "kind": p.kind.name, "default": default})
    return params


def _kind(obj) -> str:
    if inspect.isclass(obj):
        return "enum" if issubclass(obj, enum.Enum) else "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    if inspect.ismodule(obj):
        return "module"
    if callable(obj):
        return "callable"
    return "constant"


# ---- checking tune against the file ---------------------------------------------------------------------------

_POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def _same_default(theirs: str, ours: str | None) -> bool:
    """Defaults compare by value where they are literals (``16`` and ``16.0`` are the same learning-rate scale),
    and ``torchtune.`` paths in strings equal ``tune.`` ones."""
    if ours is None:
        return False
    if theirs == ours or theirs.replace("torchtune.", "tune.") == ours:
        return True
    import ast

    try:
        return ast.literal_eval(theirs) == ast.literal_eval(ours)
    except (ValueError, SyntaxError):
        return False


def signature_problems(theirs: list[dict], obj) -> list[str]:
    """Why ``obj`` (tune's function or class) cannot be called as torchtune's ``theirs`` parameters allow: every
    positional parameter at the same position with the same name, every keyword accepted, the same defaults, and
    no extra parameter without a default. Extra parameters with defaults after torchtune's are compatible."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    if inspect.isclass(obj) and params and params[0].name == "self":
        params = params[1:]
    ours = {p.name: p for p in params}
    positional = [p for p in params if p.kind.name in _POSITIONAL]
    problems, index = [], 0
    for t in theirs:
        if t["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if not any(p.kind.name == t["kind"] for p in params):
                problems.append(f"no {'*' if t['kind'] == 'VAR_POSITIONAL' else '**'}{t['name']}")
            continue
        if t["kind"] in _POSITIONAL:
            found = positional[index].name if index < len(positional) else None
            if found != t["name"]:
                problems.append(f"positional {index} is {found!r}, torchtune's is {t['name']!r}")
            index += 1
        elif t["name"] not in ours:
            problems.append(f"no keyword {t['name']!r}")
        p = ours.get(t["name"])
        if p is not None and t["default"] is not None:
            mine = None if p.default is inspect.Parameter.empty else repr(p.default)
            if not _same_default(t["default"], mine):
                problems.append(f"{t['name']} defaults to {mine}, torchtune's to {t['default']}")
    names = {t["name"] for t in theirs}
    for p in params:
        if (
            p.name not in names
            and p.default is inspect.Parameter.empty
            and p.kind.name in (*_POSITIONAL, "KEYWORD_ONLY")
        ):
            problems.append(f"extra parameter {p.name!r} without a default")
    return problems


def check(packages: dict, only: str | None = None) -> dict[str, dict[str, str]]:
    """``{torchtune package: {name: problem}}`` for every name tune lacks or offers incompatibly."""
    found: dict[str, dict[str, str]] = {}
    for package, names in packages.items():
        if only and package != only:
            continue
        ours = "tune" + package[len("torchtune") :]
        try:
            module = importlib.import_module(ours)
        except ImportError as err:
            found[package] = {name: f"no module {ours} ({err})" for name in names}
            continue
        for name, entry in names.items():
            if not hasattr(module, name):
                found.setdefault(package, {})[name] = f"missing: {ours}.{name}"
                continue
            if entry.get("params") is not None:
                problems = signature_problems(entry["params"], getattr(module, name))
                if problems:
                    found.setdefault(package, {})[name] = "; ".join(problems)
    return found


def main() -> None:
    if "--check" in sys.argv:
        sys.path.insert(0, str(OUT.parents[2]))
        only = sys.argv[sys.argv.index("--package") + 1] if "--package" in sys.argv else None
        packages = json.loads(OUT.read_text())["packages"]
        gaps = check(packages, only)
        for package, names in gaps.items():
            for name, problem in sorted(names.items()):
                print(f"{package}.{name}: {problem}")
        total = sum(len(v) for k, v in packages.items() if not only or k == only)
        print(f"{total - sum(map(len, gaps.values()))} of {total} names compatible")
        return
    import torchtune

    if torchtune.__version__.split("+")[0] != "0.6.1":
        raise SystemExit(f"needs torchtune 0.6.1, found {torchtune.__version__}")
    packages, skipped = {}, {}
    names = [m.name for m in pkgutil.walk_packages(torchtune.__path__, "torchtune.") if m.ispkg]
    for name in ["torchtune", *names]:
        if name.startswith("torchtune._cli"):
            continue
        try:
            module = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001  (recorded, not fatal: an optional dependency)
            skipped[name] = f"{type(err).__name__}: {err}"
            continue
        public = getattr(module, "__all__", None)
        if not public:
            continue
        entries = {}
        for attr in sorted(a if isinstance(a, str) else a.__name__.rsplit(".", 1)[-1] for a in public):
            obj = getattr(module, attr)  # (one package lists modules, not names, in its __all__)
            entry = {"kind": _kind(obj)}
            if entry["kind"] in ("class", "function", "callable"):
                entry["params"] = _parameters(obj)
            if entry["kind"] == "constant":
                entry["value"] = repr(obj) if isinstance(obj, (str, int, float, bool, type(None))) else None
            if entry["kind"] == "enum":
                entry["members"] = [m.name for m in obj]
            entries[attr] = entry
        packages[name] = entries
    data = {"torchtune": torchtune.__version__, "python": sys.version.split()[0], "packages": packages,
            "not_importable": skipped}  # fmt: skip
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{sum(map(len, packages.values()))} names in {len(packages)} packages -> {OUT}")


if __name__ == "__main__":
    main()
