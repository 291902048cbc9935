"""tune/_cli/main.py: the `tune` command, its help, and how user errors are reported."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tune._cli.main import build_parser

REPO = Path(__file__).resolve().parents[3]
COMMANDS = ["ls", "cp", "cat", "run", "validate", "download", "estimate", "export", "report"]


def test_help_lists_every_command(tune):
    code, out, _ = tune("--help")
    assert code == 0
    for command in COMMANDS:
        assert f"    {command} " in out
    assert "examples:" in out and "TUNE_DEBUG=1" in out


def test_no_command_prints_help_and_fails(tune):
    code, out, _ = tune()
    assert code == 2 and "commands:" in out


def test_version(tune):
    code, out, _ = tune("--version")
    assert code == 0 and out.startswith("tune ")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "run"])
def test_every_flag_of_every_command_is_documented_with_an_example(tune, command):
    parser = _subparsers()[command]
    code, out, _ = tune(command, "--help")
    assert code == 0 and "examples:" in out
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and "e.g." in action.help, f"{command} {action.dest}: no example in {action.help!r}"
        for flag in action.option_strings:
            assert flag in out


def test_run_help_documents_its_arguments_and_torchrun_flags(tune):
    code, out, _ = tune("run", "--help")
    assert code == 0
    for part in ("RECIPE", "--config CONFIG", "key=value", "TORCHRUN FLAGS", "--nproc_per_node", "--help-torchrun"):
        assert part in out
    assert "examples:" in out


def test_user_errors_are_one_line_without_a_traceback(tune, shipped):
    code, out, err = tune("cat", "toy/tiny_eco")
    assert code == 1 and out == ""
    assert err == (
        "tune: error: unknown config 'toy/tiny_eco'; did you mean toy/tiny_echo, toy/tiny_dist? "
        "(`tune ls` lists the configs)\n"
    )


def test_tune_debug_shows_the_traceback(tune, shipped, monkeypatch):
    monkeypatch.setenv("TUNE_DEBUG", "1")
    code, _, err = tune("cat", "toy/tiny_eco")
    assert code == 1
    assert "Traceback (most recent call last)" in err and "tune: error: unknown config" in err


def test_usage_errors_exit_2(tune):
    code, _, err = tune("cp", "only_one_argument")
    assert code == 2 and "usage: tune cp" in err


def test_listing_does_not_import_torch(tune_subprocess):
    # `tune ls` must answer at once; torch is imported only when a recipe or a model needs it
    assert tune_subprocess("--version").stdout.startswith("tune ")  # `python -m tune._cli` is the command
    probe = "import sys; from tune._cli.main import main; main(['ls']); print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
