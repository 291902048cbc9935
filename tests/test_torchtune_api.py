"""tune against torchtune 0.6.1's public API (tests/assets/torchtune_0_6_1_api.json, written by
tools/torchtune_api.py): every name tune does not offer as it is, under ``tune.`` with a signature torchtune's
callers can use, is a row of the "Public API" table of docs/migrating.md, and every row is true of tune today.
The rule for "as it is" is the tool's own ``check()``."""

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

from tune._cli._migrate import RENAMES, STATUSES, read_api_table

REPO = Path(__file__).resolve().parents[1]
API = REPO / "tests" / "assets" / "torchtune_0_6_1_api.json"
DOC = REPO / "docs" / "migrating.md"


def _tool():
    spec = importlib.util.spec_from_file_location("torchtune_api", REPO / "tools" / "torchtune_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _tool()


@pytest.fixture(scope="module")
def packages() -> dict[str, dict]:
    return json.loads(API.read_text())["packages"]


@pytest.fixture(scope="module")
def gaps(tool, packages) -> dict[str, str]:
    """torchtune name -> why tune does not offer it as it is."""
    return {f"{package}.{name}": why for package, names in tool.check(packages).items() for name, why in names.items()}


@pytest.fixture(scope="module")
def rows():
    return read_api_table(DOC.read_text(encoding="utf-8"))


def test_every_gap_is_a_row_of_the_migration_table(packages, gaps, rows, capsys):
    total = sum(map(len, packages.values()))
    by_status = {status: sum(row.status == status for row in rows.values()) for status in STATUSES}
    unlisted = sorted(name for name in gaps if name not in rows)
    with capsys.disabled():
        print(
            f"\ntorchtune 0.6.1 public names: {total}; present and compatible {total - len(gaps)}; "
            + "; ".join(f"listed as {status} {count}" for status, count in by_status.items())
            + f"; not listed {len(unlisted)}"
        )
    assert not unlisted, (
        f"{len(unlisted)} torchtune 0.6.1 public names that tune does not offer as they are are missing from the "
        f"'Public API' table of {DOC.relative_to(REPO)} (add a row, or offer the name):\n"
        + "\n".join(f"{name}: {gaps[name]}" for name in unlisted)
    )


def test_every_row_names_a_torchtune_public_name_with_a_known_status(packages, rows):
    public = {f"{package}.{name}" for package, names in packages.items() for name in names}
    unknown = sorted(name for name in rows if name not in public)
    assert not unknown, "rows naming no torchtune 0.6.1 public name:\n" + "\n".join(unknown)
    bad = sorted(f"{row.name}: {row.status!r}" for row in rows.values() if row.status not in STATUSES)
    assert not bad, f"rows whose status is not one of {STATUSES}:\n" + "\n".join(bad)
    empty = sorted(row.name for row in rows.values() if not row.why or not row.todo)
    assert not empty, "rows without a reason or what to do:\n" + "\n".join(empty)


def test_rows_not_offered_or_pending_name_what_tune_lacks(gaps, rows):
    # a name tune now offers (the check passes) or offers incompatibly is `different` or gone from the table
    stale = sorted(
        f"{row.name} ({row.status}): {gaps.get(row.name, 'tune offers it, compatible')}"
        for row in rows.values()
        if row.status != "different" and not gaps.get(row.name, "").startswith(("missing", "no module"))
    )
    assert not stale, "rows saying tune lacks a name that tune has:\n" + "\n".join(stale)


def test_renames_of_tune_migrate_exist_in_tune_and_public_ones_are_rows(tool, packages, rows):
    # a public torchtune name tune offers elsewhere is a `different` row, with a signature torchtune's callers can
    # use; a private path torchtune's own recipes import (torchtune.config._utils) needs only to exist in tune
    problems = []
    for theirs, ours in RENAMES.items():
        package, name = theirs.rsplit(".", 1)
        try:
            target = importlib.import_module(ours)
        except ImportError:
            module, attr = ours.rsplit(".", 1)
            target = getattr(importlib.import_module(module), attr, None)
        if target is None:
            problems.append(f"{theirs}: tune has no {ours}")
            continue
        if name not in packages.get(package, {}):
            continue
        if rows.get(theirs) is None or rows[theirs].status != "different":
            problems.append(f"{theirs}: not a row of status `different`")
        if packages[package][name].get("params") is not None:
            problems += [
                f"{theirs} -> {ours}: {p}" for p in tool.signature_problems(packages[package][name]["params"], target)
            ]
    assert not problems, "\n".join(problems)
