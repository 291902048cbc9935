import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tune.config._discovery import find_config
from tune.config._errors import ConfigError, TuneError
from tune.config._imports import import_modules
from tune.config._io import check_output_dir
from tune.config._load import load_config
from tune.config._training import apply_defaults, check_config_keys, optional_key_tables
from tune.config._validate import value_problems

_EPILOG = """\
overrides:
  key=value      set a key (dotted for nested keys, YAML values): batch_size=8 optimizer.lr=2e-5
  ~key           delete a key: ~profiler
  key=a.b.c      on a component node, swap the component: model=tune.models.llama3_2.lora_llama3_2_3b

TUNE_DEBUG=1 shows Python tracebacks for errors otherwise reported in one line.
"""


def parse(recipe_main: Callable[[DictConfig], Any]) -> Callable[..., Any]:
    """Turns ``recipe_main(cfg)`` into a script entry point that reads ``--config FILE [key=value ...]``.

    Use it on a recipe's main function, so the recipe runs both as ``tune run my_recipe.py --config my.yaml``
    and as ``python my_recipe.py --config my.yaml optimizer.lr=1e-4``::

        @config.parse
        def recipe_main(cfg: DictConfig) -> None:
            ...

        if __name__ == "__main__":
            sys.exit(recipe_main())

    ``--config`` takes a file or the name of a shipped config. The optional keys of the tables the recipe
    names in ``RECIPE_INFO["optional_keys"]`` are filled in where the config leaves them out
    (:data:`~tune.config.OPTIONAL_KEYS`), and a top-level key such a recipe never reads is an error naming the
    closest known key (the recipe file is scanned, so a copied recipe that reads a new key knows it). The modules
    the config lists under ``imports:`` are imported before ``recipe_main`` runs (see
    :func:`~tune.config.import_modules`), and a training run's ``output_dir`` is checked for an earlier run's
    outputs (:func:`~tune.config.check_output_dir`). A :class:`~tune.config.TuneError` (a bad config, override or
    name, a module of ``imports:`` that cannot be imported, an ``output_dir`` holding an earlier run), from loading
    or from inside ``recipe_main``, is printed as one ``error:`` line and exits with status 1 (``TUNE_DEBUG=1``
    raises it with its traceback instead). Under torchrun only rank 0 prints it, and every other rank exits with
    status 1 silently: the ranks of a distributed recipe raise a ``TuneError`` together (see
    :func:`tune.training.errors_on_all_ranks`).

    Args:
        recipe_main (Callable[[DictConfig], Any]): the function taking the loaded config.

    Returns:
        Callable[..., Any]: ``main(argv=None)``; ``argv`` defaults to ``sys.argv[1:]``.
    """

    @functools.wraps(recipe_main)
    def main(argv: Sequence[str] | None = None) -> Any:
        prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "recipe"
        args = _parser(prog, recipe_main).parse_intermixed_args(sys.argv[1:] if argv is None else list(argv))
        try:
            cfg = load_config(find_config(args.config), args.overrides)
            info = recipe_main.__globals__.get("RECIPE_INFO")
            tables = optional_key_tables(info)
            apply_defaults(cfg, tables)  # the optional keys the recipe reads, from the tables RECIPE_INFO names
            if isinstance(info, dict) and "optional_keys" in info:  # the recipe knows its keys: others are typos
                check_config_keys(cfg, recipe_main.__globals__.get("__file__"), tables)
            import_modules(cfg)  # `imports:` register user components before the recipe builds anything
            # types, ranges, names: what `tune run` checks before it starts (keys the recipe refuses: its own reason)
            problems = value_problems(cfg, refused=recipe_main.__globals__.get("UNSUPPORTED") or ())
            if problems:
                raise ConfigError(problems)
            check_output_dir(cfg)  # a training run never mixes its outputs with an earlier run's
            return recipe_main(cfg)
        except TuneError as err:
            if os.environ.get("TUNE_DEBUG") == "1":
                raise
            # under torchrun every rank raises the same error together (the same config, or a failed write shared
            # by tune.training.errors_on_all_ranks): rank 0 prints it, the others only exit with the same status.
            # Every rank also leaves it in torchrun's error file, so that torchrun's summary of the first rank to
            # fail says why, also when that rank alone failed (a file missing on one node)
            # `tune run` with torchrun flags prints the first failed rank's error itself (it sets this variable)
            if os.environ.get("RANK", "0") == "0" and os.environ.get("TUNE_LAUNCHER_REPORTS_ERRORS") != "1":
                _end_progress_bars()
                print(f"{prog}: error: {err}", file=sys.stderr)
            _record_for_torchrun(err)
            raise SystemExit(1) from None

    return main


def _end_progress_bars() -> None:
    """Closes the recipe's open progress bars, so that an error raised mid-epoch starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def _record_for_torchrun(err: TuneError) -> None:
    """Writes ``err`` where torchrun reads a failed worker's cause (``TORCHELASTIC_ERROR_FILE``, in the JSON layout
    of torch's elastic error handler); nothing outside torchrun."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    said = f"{type(err).__name__}: {err}"
    data = {"message": {"message": said, "extraInfo": {"py_callstack": said, "timestamp": str(int(time.time()))}}}
    temp = f"{path}.{os.getpid()}.tmp"
    try:  # whole or not at all (the disk may be full): torchrun fails on a file it cannot parse
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(temp, path)
    except OSError:  # the summary then says less; the exit status is what matters
        with contextlib.suppress(OSError):
            os.remove(temp)


def _parser(prog: str, recipe_main: Callable[..., Any]) -> argparse.ArgumentParser:
    module = sys.modules.get(recipe_main.__module__)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(module.__doc__ or "").strip() or None,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="CONFIG",
        help="YAML config file, or the name of a shipped config (e.g. --config my.yaml)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (see below)")
    return parser
