"""``tune``: the command line of tune. Each subcommand lives in its own module with ``add_parser`` and ``run``."""

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

import tune
from tune._cli import _cat, _cp, _download, _estimate, _export, _ls, _migrate, _report, _run, _validate
from tune._cli._common import HelpFormatter, examples
from tune.config import TuneError

_COMMANDS = {
    "ls": _ls,
    "cp": _cp,
    "cat": _cat,
    "run": _run,
    "validate": _validate,
    "estimate": _estimate,
    "download": _download,
    "migrate": _migrate,
    "export": _export,
    "report": _report,
}
_DESCRIPTION = """\
tune: fine-tune large language models with native-PyTorch recipes.

Recipes are scripts (`tune cp` one to edit it); configs are YAML files whose keys override as key=value."""


def build_parser() -> argparse.ArgumentParser:
    """The ``tune`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tune",
        description=_DESCRIPTION,
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune ls lora",
            "tune download Qwen/Qwen2.5-0.5B-Instruct --output-dir /tmp/Qwen2.5-0.5B-Instruct",
            "tune run lora_finetune_single_device --config qwen2_5/0.5B_lora_single_device batch_size=4",
            "tune cp lora_finetune_single_device my_recipe.py && tune run my_recipe.py --config my.yaml",
            "tune validate my.yaml --recipe lora_finetune_single_device",
            "tune estimate llama3_1/8B_full_single_device --device-memory 80GiB",
            "tune migrate my_torchtune_project/ --dry-run",
            "tune export /tmp/my_run/step_500 --format gguf --dtype q8_0",
            "tune report /tmp/run_a /tmp/run_b --out compare.html",
            "",
            "`tune CMD --help` documents each command. TUNE_DEBUG=1 shows Python tracebacks for errors.",
        ),
    )
    parser.add_argument("--version", action="version", version=f"tune {tune.__version__}", help="print the version")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for module in _COMMANDS.values():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``tune ARGS``.

    Args:
        argv (Sequence[str] | None): the arguments after ``tune``; ``sys.argv[1:]`` when None.

    Returns:
        int: the exit status: 0 on success, 1 for an error the user can fix (printed as one ``tune: error:``
        line), 2 for a command-line usage error.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            if argv and argv[0] == "run":
                # `tune run` passes torchrun flags and recipe arguments through: it parses them itself
                return _run.main(argv[1:])
            parser = build_parser()
            args = parser.parse_args(argv)
            if args.command is None:
                parser.print_help()
                return 2
            return _COMMANDS[args.command].run(args)
        except TuneError as err:
            if os.environ.get("TUNE_DEBUG") == "1":
                traceback.print_exc()
            print(f"tune: error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("tune: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            # `tune ls | head`: the reader left; stop quietly (and keep Python from reporting it at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # one readable line for warnings raised while the CLI itself works (a broken plugin, say); a recipe's own
    # warnings keep Python's format, see _run
    if os.environ.get("TUNE_DEBUG") == "1":
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=file or sys.stderr)
        return
    print(f"tune: warning: {message}", file=file or sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
