"""``tune migrate PATH... [--output DIR] [--dry-run]``: moves torchtune configs and Python code over to tune.

The rewriting is textual and limited to names, so everything else (comments, spacing, quoting, line endings) stays
byte for byte: in Python, the tokens of ``torchtune`` dotted names in imports and code and the string literals that
are whole dotted paths (``"torchtune.models.llama3_2.llama3_2_1b"``); in YAML, the scalars that are dotted paths
(``_component_: torchtune.datasets.alpaca_dataset``), found with PyYAML's scanner. A name tune has under another
path (:data:`RENAMES`) is written under its new one; every other name only loses the ``torch`` of its prefix.
Names that need a person (no equivalent in tune, or a deliberate difference) are read from the "Public API"
and "Module paths" tables of docs/migrating.md and reported with their file, line and section. A run's output
folders are skipped. A migrated file holds no ``torchtune`` name, so a second run changes nothing.
"""

import argparse
import ast
import dataclasses
import difflib
import io
import os
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

import tune
from tune._cli._common import HelpFormatter, examples

# torchtune 0.6.1 public names that tune has under another path or name: torchtune name -> tune name. Keys are
# dotted paths (a module key moves everything under it); the longest matching key wins. Every key is a row of
# docs/migrating.md's "Public API" table with status `different`, and every value is a name tune has with a
# compatible signature (tests/test_torchtune_api.py checks both): a name whose tune counterpart takes other
# arguments (torchtune's Qwen2 builders, which tune has in tune.models.qwen2_5) is a row to report, not a rename.
RENAMES: dict[str, str] = {
    # torchtune's recipes import these from private modules; tune has them public
    "torchtune.config._utils._get_component_from_path": "tune.config.get_component_from_path",
    "torchtune.modules.common_utils": "tune.modules",
    # torchtune before 0.5 had its tokenizer classes here (0.5 moved them under modules.transforms)
    "torchtune.modules.tokenizers": "tune.modules.transforms.tokenizers",
}
# Config keys: none renamed. tune's recipes read torchtune's keys; a torchtune QAT `quantizer:` entry is read as a
# `model_converters:` entry when the file is loaded (tune/config/_load.py), so configs keep it.

# the statuses of the "Public API" table of docs/migrating.md
STATUSES = ("different", "not offered", "pending issue 17", "pending issue 18")
TABLE_HEADER = ("torchtune name", "status", "why", "what you do")
# the sections of docs/migrating.md whose tables `tune migrate` reports from, and the one that explains module paths
API_SECTION = "Public API"
MODULES_SECTION = "Module paths"
DOC = "docs/migrating.md"
SUFFIXES = (".py", ".yaml", ".yml")
# A run's output (checkpoints, the saved config, logs) is left alone: a folder of these names, or one holding a
# file that only a run writes, is neither scanned nor rewritten unless it is given as a PATH itself.
RUN_OUTPUT_DIRS = ("output", "outputs")
RUN_OUTPUT_FILES = (".complete", "recipe_state.pt", "torchtune_config.yaml")
RUN_OUTPUT_SUFFIXES = (".safetensors",)

_DOTTED = re.compile(r"torchtune(?:\.[A-Za-z_]\w*)+")
_PACKAGE_DIR = Path(tune.__file__).resolve().parent


class MigrateError(Exception):
    """A file that cannot be migrated (it does not parse); the message names the line."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the "Public API" table: a torchtune name tune does not offer as it is."""

    name: str
    status: str
    why: str
    todo: str
    section: str = API_SECTION


@dataclasses.dataclass
class Migrated:
    """A file's migrated text, how many rewrites of each kind it took, and the torchtune names it mentions."""

    text: str
    counts: Counter = dataclasses.field(default_factory=Counter)
    # (line, torchtune dotted name, whether it was written as an import of that module)
    mentions: list[tuple[int, str, bool]] = dataclasses.field(default_factory=list)


def tune_name(name: str) -> str:
    """tune's name for torchtune's dotted ``name``: the longest key of :data:`RENAMES` that is ``name`` or a
    module above it, replaced by its value; else ``name`` with ``torchtune`` replaced by ``tune``."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        renamed = RENAMES.get(".".join(parts[:end]))
        if renamed is not None:
            return ".".join([renamed, *parts[end:]])
    return "tune" + name[len("torchtune") :]


def _is_renamed(name: str) -> bool:
    return tune_name(name) != "tune" + name[len("torchtune") :]


# ---- Python --------------------------------------------------------------------------------------------------


def migrate_python(source: str) -> Migrated:
    """Rewrites the torchtune names of Python ``source``; see the module docstring.

    Raises:
        MigrateError: ``source`` is not valid Python.
    """
    try:
        tree = ast.parse(source)
        lines = io.StringIO(source, newline="").readlines()
        tokens = list(tokenize.generate_tokens(iter(lines).__next__))
    except (SyntaxError, tokenize.TokenError) as err:
        line = getattr(err, "lineno", None) or (err.args[1][0] if len(err.args) > 1 else "?")
        raise MigrateError(f"line {line}: Python that does not parse ({err.args[0]})") from None
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int) -> int:
        return starts[row - 1] + col

    def ast_offset(row: int, byte_col: int) -> int:  # ast columns count UTF-8 bytes
        return offset(row, len(lines[row - 1].encode()[:byte_col].decode(errors="ignore")))

    result = Migrated(source)
    edits: list[tuple[int, int, str]] = []
    done: list[tuple[int, int]] = []  # spans rewritten as whole import statements
    import_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            import_lines.update(range(node.lineno, node.end_lineno + 1))
            for alias in node.names:
                if alias.name.split(".")[0] == "torchtune":
                    result.mentions.append((node.lineno, alias.name, True))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "torchtune":
                continue
            start = ast_offset(node.lineno, node.col_offset)
            end = ast_offset(node.end_lineno, node.end_col_offset)
            indent = lines[node.lineno - 1][: start - starts[node.lineno - 1]]
            edits.append((start, end, _from_import(node, source[start:end], indent, result)))
            done.append((start, end))

    previous = None
    index = 0
    while index < len(tokens):
        token = tokens[index]
        at = offset(*token.start)
        if any(a <= at < b for a, b in done):
            index += 1
            continue
        if token.type == tokenize.NAME and token.string == "torchtune" and not _is_dot(previous):
            chain = [token]
            while (
                index + 2 < len(tokens)
                and _is_dot(tokens[index + 1])
                and tokens[index + 2].type == tokenize.NAME
                and tokens[index + 1].start == chain[-1].end
                and tokens[index + 2].start == tokens[index + 1].end
            ):
                chain.append(tokens[index + 2])
                index += 2
            name = ".".join(t.string for t in chain)
            new = tune_name(name)
            edits.append((at, offset(*chain[-1].end), new))
            in_import = token.start[0] in import_lines
            result.counts["imports" if in_import else "names in code"] += 1
            if _is_renamed(name):
                result.counts["renamed"] += 1
            if not in_import:
                result.mentions.append((token.start[0], name, False))
        elif token.type == tokenize.STRING:
            new = _string(token.string)
            if new is not None:
                edits.append((at, offset(*token.end), new[0]))
                result.counts["strings"] += 1
                result.counts["renamed"] += _is_renamed(new[1])
                result.mentions.append((token.start[0], new[1], False))
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tokens[index]
        index += 1
    result.text = _apply(source, edits)
    return result


def _is_dot(token: tokenize.TokenInfo | None) -> bool:
    return token is not None and token.type == tokenize.OP and token.string == "."


def _from_import(node: ast.ImportFrom, text: str, indent: str, result: Migrated) -> str:
    """``from torchtune.x import a, b`` rewritten: the module path alone when every name stays together under its
    name, else one statement per tune module (``New as Old`` keeps a renamed name's binding)."""
    targets = []
    for alias in node.names:
        full = f"{node.module}.{alias.name}"
        result.mentions.append((getattr(alias, "lineno", node.lineno), full, False))
        if alias.name == "*":
            targets.append((tune_name(node.module), "*", None))
            continue
        module, name = tune_name(full).rsplit(".", 1)
        targets.append((module, name, alias.asname or (alias.name if name != alias.name else None)))
        result.counts["renamed"] += _is_renamed(full)
    result.counts["imports"] += 1
    modules = list(dict.fromkeys(module for module, _, _ in targets))
    if tune_name(node.module) in modules:  # some names stay in the module: is it one tune has?
        result.mentions.append((node.lineno, node.module, True))
    same_names = all(name == alias.name for (_, name, _), alias in zip(targets, node.names))
    found = re.match(r"from(\s+)" + re.escape(node.module) + r"(?=\s)", text)
    if len(modules) == 1 and same_names and found:
        return f"from{found.group(1)}{modules[0]}{text[found.end() :]}"
    statements = []
    for module in modules:
        names = [f"{name} as {asname}" if asname else name for m, name, asname in targets if m == module]
        statements.append(f"from {module} import {', '.join(names)}")
    # the statement's own comments (inside its parentheses) follow the last one
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    if comments:
        statements[-1] += "  " + " ".join(comments)
    # a statement that opens its line is split over lines; one after `if x:` or `;` stays on its line
    return ("\n" + indent if not indent.strip() else "; ").join(statements)


def _string(literal: str) -> tuple[str, str] | None:
    """A string literal whose value is a torchtune dotted path, rewritten: (new literal, torchtune name)."""
    found = re.match(r"([rRbBuU]*)('''|\"\"\"|'|\")", literal)
    if found is None or "b" in found.group(1).lower():
        return None
    quote = found.group(2)
    value = literal[found.end() : len(literal) - len(quote)]
    if not _DOTTED.fullmatch(value):
        return None
    return literal[: found.end()] + tune_name(value) + quote, value


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    pieces, at = [], 0
    for start, end, new in sorted(edits):
        assert start >= at, "overlapping rewrites"
        pieces += [text[at:start], new]
        at = end
    return "".join(pieces) + text[at:]


# ---- YAML ----------------------------------------------------------------------------------------------------


def migrate_yaml(source: str) -> Migrated:
    """Rewrites the scalars of YAML ``source`` that are torchtune dotted paths (``_component_`` values and any
    other), keeping comments, quoting and layout.

    Raises:
        MigrateError: ``source`` is not valid YAML.
    """
    import yaml

    try:
        yaml.safe_load(source)
        tokens = [t for t in yaml.scan(source) if isinstance(t, yaml.ScalarToken)]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise MigrateError(f"{where}YAML that does not parse ({problem})") from None
    result = Migrated(source)
    edits = []
    for token in tokens:
        if not _DOTTED.fullmatch(token.value):
            continue
        start, end = token.start_mark.index, token.end_mark.index
        raw = source[start:end]
        at = raw.find(token.value)
        if at < 0:  # written with escapes or folded over lines: not a path a config writes that way
            continue
        edits.append((start + at, start + at + len(token.value), tune_name(token.value)))
        result.counts["config values"] += 1
        result.counts["renamed"] += _is_renamed(token.value)
        result.mentions.append((token.start_mark.line + 1, token.value, False))
    result.text = _apply(source, edits)
    return result


# ---- the table of docs/migrating.md ---------------------------------------------------------------------------


def table_path() -> Path | None:
    """docs/migrating.md: shipped inside the package (``tune/_shipped``) or in a source checkout."""
    for path in (_PACKAGE_DIR / "_shipped" / "migrating.md", _PACKAGE_DIR.parent / "docs" / "migrating.md"):
        if path.is_file():
            return path
    return None


def anchor(heading: str) -> str:
    """The link anchor of a Markdown heading as GitHub writes it: ``"Module paths"`` -> ``"module-paths"``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def read_api_table(text: str, sections: tuple[str, ...] = (API_SECTION,)) -> dict[str, Row]:
    """The rows of the tables of docs/migrating.md's ``sections`` (default: "Public API"), by torchtune name
    (backticks removed); each row records the section it is in.

    Raises:
        ValueError: no such section or table, a row with the wrong number of cells, or a name listed twice.
    """
    rows: dict[str, Row] = {}
    for title in sections:
        section = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
        if section is None:
            raise ValueError(f"no '## {title}' section")
        _read_table(section.group(1), title, rows)
    return rows


def _read_table(text: str, title: str, rows: dict[str, Row]) -> None:
    header = None
    for number, line in enumerate(text.splitlines()):
        if not line.startswith("|"):
            if header is not None:
                break  # the end of the table
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            header = tuple(c.lower() for c in cells)
            if header != TABLE_HEADER:
                raise ValueError(f"the table's header is {cells}, expected {list(TABLE_HEADER)}")
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the line under the header
        if len(cells) != len(TABLE_HEADER):
            raise ValueError(f"row {line!r} has {len(cells)} cells, expected {len(TABLE_HEADER)}")
        name = cells[0].strip("`")
        if name in rows:
            raise ValueError(f"{name} is listed twice (line {number + 1} of the '{title}' section)")
        why, todo = cells[2].replace("\\|", "|"), cells[3].replace("\\|", "|")
        rows[name] = Row(name, cells[1].strip("`"), why, todo, title)
    if header is None:
        raise ValueError(f"the '{title}' section has no table")


def _needs_a_person(migrated: Migrated, rows: dict[str, Row]) -> list[tuple[int, str]]:
    """(line, message) for each torchtune name of the file that the table lists (a renamed name is rewritten,
    not listed), and each imported module that tune does not have, on a line with no listed name."""
    found: dict[tuple[int, str], None] = {}
    listed_lines = set()
    for line, name, _ in migrated.mentions:
        parts = name.split(".")
        for end in range(len(parts), 1, -1):
            prefix = ".".join(parts[:end])
            row = rows.get(prefix)
            if row is not None and not _is_renamed(prefix):
                see = f"see {DOC}#{anchor(row.section)}"
                found[(line, f"{prefix} ({row.status}) — {row.why} — {row.todo} — {see}")] = None
                listed_lines.add(line)
                break
    for line, name, module_import in migrated.mentions:
        if module_import and line not in listed_lines and not _is_module(tune_name(name)):
            found[(line, f"{name} — tune has no module {tune_name(name)} — see {DOC}#{anchor(MODULES_SECTION)}")] = None
    return sorted(found)


def _is_module(name: str) -> bool:
    """Whether ``tune.a.b`` is a module of the installed tune (found on disk: nothing is imported)."""
    path = _PACKAGE_DIR.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


# ---- the command ---------------------------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="rewrite torchtune configs and Python code for tune",
        description=(
            "Rewrite torchtune configs (.yaml, .yml) and Python files (.py) for tune, in place or into --output:\n"
            "`torchtune.` names become `tune.` ones (imports, code, string literals that are dotted paths, YAML\n"
            "values such as `_component_`), and names tune has under another path are written under it. Nothing\n"
            "else changes: comments and formatting stay as they are, and a second run changes nothing. Prints the\n"
            "files changed, the rewrites by kind, and every place that needs a person (file:line: name — why —\n"
            "what to do — the section of docs/migrating.md to read). A directory is walked for .py, .yaml and\n"
            ".yml files; hidden folders, __pycache__ and a run's output (a folder named output or outputs, or\n"
            "one holding .complete, recipe_state.pt, torchtune_config.yaml or .safetensors files) are skipped,\n"
            "each named on stderr. Exit status 1 when a file could not be migrated (each one is reported on one\n"
            "line; the others are migrated)."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune migrate my_project/ --dry-run",
            "tune migrate my_project/",
            "tune migrate configs/ my_recipe.py --output migrated/",
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="file or directory to migrate; e.g. my_project/")
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="write the migrated files under DIR instead of in place, with the layout below each PATH that is a "
        "directory (a PATH that is a file lands in DIR); unchanged files are written too; e.g. --output migrated/",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the changes as a unified diff and write nothing")


def run(args: argparse.Namespace) -> int:
    output = Path(args.output).expanduser() if args.output else None
    failed = 0
    jobs: list[tuple[Path, Path]] = []  # (file, where it is written)
    skipped: list[tuple[Path, str]] = []
    for raw in args.paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(_walk(path, output, skipped))
            jobs += [(f, output / f.relative_to(path) if output else f) for f in found]
        elif path.is_file() and path.suffix not in SUFFIXES:
            _error(raw, f"not a {', '.join(SUFFIXES)} file")
            failed += 1
        elif path.is_file():
            jobs.append((path, output / path.name if output else path))
        else:
            _error(raw, "no such file or directory")
            failed += 1
    for folder, reason in sorted(skipped):
        print(f"tune migrate: skipped {folder}: {reason}; name it as a PATH to migrate it anyway", file=sys.stderr)
    rows, note = _rows()
    if note:
        print(f"note: {note}", file=sys.stderr)
    counts: Counter = Counter()
    changed, people, seen, targets = 0, [], set(), set()
    for path, dest in jobs:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        if dest.resolve() in targets:
            _error(path, f"another file is also written to {dest}")
            failed += 1
            continue
        targets.add(dest.resolve())
        try:
            data = path.read_bytes()
            encoding = _encoding(path, data)
            source = data.decode(encoding)
            migrated = migrate_python(source) if path.suffix == ".py" else migrate_yaml(source)
        except OSError as err:
            _error(path, f"cannot read it ({err.strerror or err})")
            failed += 1
            continue
        except UnicodeDecodeError as err:
            _error(path, f"not {err.encoding} text (byte {err.start})")
            failed += 1
            continue
        except MigrateError as err:
            _error(path, str(err))
            failed += 1
            continue
        counts += migrated.counts
        people += [f"{path}:{line}: {message}" for line, message in _needs_a_person(migrated, rows)]
        if migrated.text != source:
            changed += 1
        if args.dry_run:
            if migrated.text != source:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        source.splitlines(keepends=True),
                        migrated.text.splitlines(keepends=True),
                        str(path),
                        str(dest),
                    )
                )
            continue
        if migrated.text != source or dest != path:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(migrated.text.encode(encoding))
            except OSError as err:
                _error(dest, f"cannot write it ({err.strerror or err})")
                failed += 1
    _summary(len(seen), changed, counts, people, failed, args.dry_run)
    return 1 if failed else 0


def _walk(root: Path, output: Path | None, skipped: list[tuple[Path, str]]):
    """The .py/.yaml/.yml files under ``root``, not entering hidden folders, ``__pycache__``, ``output`` and a run's
    output folders below ``root`` (each one appended to ``skipped`` with the reason)."""
    skip = output.resolve() if output else None
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        kept = []
        for name in sorted(dirs):
            path = here / name
            if name.startswith(".") or name == "__pycache__":
                continue
            if skip is not None and path.resolve() == skip:
                continue
            reason = _run_output(path)
            if reason is not None:
                skipped.append((path, reason))
                continue
            kept.append(name)
        dirs[:] = kept  # os.walk enters only these
        for name in sorted(files):
            if Path(name).suffix in SUFFIXES and (here / name).is_file():
                yield here / name


def _run_output(folder: Path) -> str | None:
    """Why ``folder`` is the output of a training run (so not a user's source), or None when it is not one."""
    if folder.name in RUN_OUTPUT_DIRS:
        return f"a run's output folder ({folder.name}/)"
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except OSError:
        return None
    for name in sorted(names):
        if name in RUN_OUTPUT_FILES or name.endswith(RUN_OUTPUT_SUFFIXES):
            return f"holds {name}, written by a run"
    return None


def _encoding(path: Path, data: bytes) -> str:
    if path.suffix == ".py":  # PEP 263: a `# -*- coding: ... -*-` line, else UTF-8
        try:
            return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        except SyntaxError:
            return "utf-8"
    return "utf-8"


def _rows() -> tuple[dict[str, Row], str | None]:
    path = table_path()
    if path is None:
        return {}, "docs/migrating.md not found: places that need a person are not reported"
    try:
        return read_api_table(path.read_text(encoding="utf-8"), (API_SECTION, MODULES_SECTION)), None
    except (OSError, ValueError) as err:
        return {}, f"{path}: {err}: places that need a person are not reported"


def _error(path, message: str) -> None:
    print(f"tune: error: {path}: {message}", file=sys.stderr)


def _summary(total: int, changed: int, counts: Counter, people: list[str], failed: int, dry_run: bool) -> None:
    kinds = ", ".join(f"{kind}: {counts[kind]}" for kind in sorted(counts) if counts[kind])
    verb = "would change" if dry_run else "changed"
    line = f"tune migrate: {verb} {changed} of {total} file{'s' if total != 1 else ''}"
    line += f" ({kinds})" if kinds else ""
    if failed:
        line += f"; {failed} could not be migrated"
    print(line)
    if people:
        print(f"{len(people)} place{'s' if len(people) != 1 else ''} need{'s' if len(people) == 1 else ''} a person:")
        for entry in people:
            print(f"  {entry}")
