"""``tune run [TORCHRUN FLAGS] RECIPE --config CONFIG [key=value ...]``.

Without torchrun flags the recipe runs in this process, as if started with ``python RECIPE.py --config ...``
(``runpy`` with ``__name__ == "__main__"``). With them it is launched through ``torch.distributed.run`` (the
``torchrun`` launcher's own argument parser and ``run`` function), once per process. When a run that logged
metrics ends, ``report_run`` records it in ``run.json``, writes ``report.html`` (both beside the log, in
``output_dir/logs`` with the shipped configs) and prints where the log and the report are.
"""

import argparse
import json
import logging
import os
import runpy
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from tune._cli._common import HelpFormatter, examples
from tune.config import (
    ConfigError,
    RecipeError,
    RecipeInfo,
    TuneError,
    check_output_dir,
    configs_of,
    find_config,
    find_recipe,
    import_modules,
    list_recipes,
    load_config,
    read_unsupported,
    value_problems,
)

_ORIGINAL_SHOWWARNING = warnings.showwarning
# set for the processes of a distributed run that `tune run` launched: it reports the first rank's error itself
LAUNCHER_REPORTS_ERRORS = "TUNE_LAUNCHER_REPORTS_ERRORS"
_USAGE = "tune run [TORCHRUN FLAGS] RECIPE --config CONFIG [key=value ...]"
_DESCRIPTION = """\
Run a recipe with a config.

  RECIPE   a built-in recipe (`tune ls`), a plugin's recipe, or a path to a .py file (absolute or relative),
           e.g. lora_finetune_single_device, ./my_recipe.py, /home/me/recipes/my_recipe.py; torchtune's
           qat_distributed, qat_single_device and qat_lora_finetune_distributed run full_finetune_distributed,
           full_finetune_single_device and lora_finetune_distributed (QAT is a model converter here)
  --config CONFIG
           a shipped config name or a YAML file, e.g. --config llama3_2/1B_lora_single_device, --config my.yaml
  key=value
           overrides: batch_size=8, optimizer.lr=2e-5 (dotted keys, YAML values; a value may contain `=`),
           ~profiler deletes a key, model=tune.models.qwen2_5.lora_qwen2_5_1_5b swaps a component,
           output_dir=${oc.env:HOME}/runs interpolates
  TORCHRUN FLAGS
           given before RECIPE, launch the recipe with torch.distributed.run (torchrun) in several processes,
           e.g. --nproc_per_node 2, --nnodes 2 --rdzv_endpoint host:29500, --standalone. Only recipes that
           support distributed runs accept them (`tune ls` says which). `tune run --help-torchrun` lists them all.
  -h, --help
           print this help; `tune run RECIPE --help` prints the recipe's own help
  --help-torchrun
           print every torchrun flag, e.g. `tune run --help-torchrun`"""


def add_parser(subparsers) -> None:
    # only for `tune --help`: main() hands `tune run ...` to main() below, which parses it itself
    subparsers.add_parser(
        "run",
        help="run a recipe with a config (in this process, or with torchrun flags in several)",
        usage=_USAGE,
        description=_DESCRIPTION,
        formatter_class=HelpFormatter,
        epilog=_EPILOG,
        add_help=False,
    )


_EPILOG = examples(
    "tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device",
    "tune run lora_finetune_single_device --config my.yaml batch_size=4 dataset.packed=true ~profiler",
    "tune run ./my_recipe.py --config my.yaml",
    "tune run --nproc_per_node 2 full_finetune_distributed --config llama3_1/8B_full",
    "tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint node0:29500 \\",
    "    full_finetune_distributed --config llama3_1/8B_full",
)


def main(argv: Sequence[str]) -> int:
    """Runs ``tune run ARGV``; returns the exit status."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {_USAGE}\n\n{_DESCRIPTION}\n\n{_EPILOG}")
        return 0 if argv else 2
    if argv[0] == "--help-torchrun":
        _torchrun_parser().print_help()
        return 0
    if argv[0].startswith("-"):
        return _run_distributed(argv)
    recipe = find_recipe(argv[0])
    config_args = _config_args(recipe, argv[1:])
    check_before_start(config_args, recipe.path)
    started = time.time()
    status = _run_in_process(recipe, config_args)
    if status == 0:
        report_run(recipe.name, argv[1:], config_args, started)
    return status


def check_before_start(config_args: list[str], recipe_path: str | Path | None = None) -> None:
    """Refuses a config whose values cannot run (``tune.config.value_problems``), before the recipe starts, and
    warns once about bf16 on a CPU that emulates it.

    Runs in the launching process: a distributed run gets the same one line as a single-device one, before
    torchrun starts any process. A config that does not load is left to the recipe, which says why.

    Args:
        config_args (list[str]): ``["--config", FILE, key=value, ...]`` as given to the recipe.
        recipe_path (str | Path | None): the recipe file: the keys its ``UNSUPPORTED`` table refuses are left to
            its own check, which gives its reason (and reports them with the recipe's other problems). An
            ``output_dir`` that holds an earlier run is refused here too (``tune.config.check_output_dir``), unless
            the config opts in to overwrite it, which the recipe does itself.

    Raises:
        ConfigError: listing every problem found.
    """
    if len(config_args) < 2 or config_args[0] != "--config" or any(a in ("-h", "--help") for a in config_args):
        return
    try:
        cfg = load_config(config_args[1], config_args[2:])
        import_modules(cfg)  # components the config names may live in its `imports:`
    except TuneError:
        return  # the recipe reports it, as it does when run as a script
    refused = read_unsupported(recipe_path) if recipe_path is not None else {}
    problems = value_problems(cfg, refused=refused)
    if problems:
        raise ConfigError(problems, source=config_args[1])
    if not cfg.get("overwrite_output_dir"):  # a rerun into an earlier run's outputs: the same one line
        check_output_dir(cfg)
    _warn_bf16_on_cpu(cfg.get("device"), cfg.get("dtype"))


def _warn_bf16_on_cpu(device: object, dtype: object) -> None:
    if str(dtype).lower().removeprefix("torch.") not in ("bf16", "bfloat16"):
        return
    import torch

    from tune.utils import cpu_has_native_bf16

    on_cpu = device == "cpu" or (device in (None, "auto") and not torch.cuda.is_available())
    if on_cpu and not cpu_has_native_bf16():
        print(
            "tune: warning: dtype=bf16 on a CPU without native bfloat16 (no avx512_bf16/amx_bf16): its math is "
            "emulated and training runs many times slower than in fp32. Set dtype=fp32 to train faster on this "
            "CPU.",
            file=sys.stderr,
        )


def _config_args(recipe: RecipeInfo, args: list[str]) -> list[str]:
    """``--config CONFIG rest...`` with CONFIG resolved to a file (or ``args`` unchanged for ``--help``)."""
    config, rest, help_asked = None, [], False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config":
            if i + 1 == len(args):
                raise TuneError("--config needs a value: a config name (`tune ls`) or a YAML file")
            config, i = args[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config = arg.partition("=")[2]
        elif arg in ("-h", "--help"):
            help_asked = True
            rest.append(arg)
        elif arg.startswith("-"):
            raise TuneError(
                f"unexpected flag {arg!r} after the recipe. Recipe arguments are `--config CONFIG key=value ...`; "
                f"torchrun flags go before the recipe: tune run --nproc_per_node 2 {recipe.name} --config ..."
            )
        else:
            rest.append(arg)
        i += 1
    if config is None:
        if help_asked:
            return rest
        known = sorted(configs_of(recipe))
        hint = f" Its configs: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}." if known else ""
        raise TuneError(f"`tune run {recipe.name}` needs --config CONFIG (a config name or a YAML file).{hint}")
    return ["--config", str(find_config(config).resolve()), *rest]


def _run_in_process(recipe: RecipeInfo, args: list[str]) -> int:
    saved_argv, saved_path = sys.argv, list(sys.path)
    # what `python recipe.py ...` would see: its own path as argv[0], its folder first on sys.path
    sys.argv = [str(recipe.path), *args]
    sys.path.insert(0, str(recipe.path.parent))
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _ORIGINAL_SHOWWARNING
            runpy.run_path(str(recipe.path), run_name="__main__")
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _torchrun_parser() -> argparse.ArgumentParser:
    from torch.distributed import run as torchrun  # imports torch: only for distributed launches

    parser = torchrun.get_args_parser()
    parser.prog = "tune run"
    parser.usage = _USAGE
    return parser


def _run_distributed(argv: list[str]) -> int:
    parser = _torchrun_parser()
    args = parser.parse_args(argv)
    recipe = find_recipe(args.training_script)
    if recipe.has_info and not recipe.supports_distributed:  # a script without RECIPE_INFO (a torchtune copy) may go
        flags = " ".join(argv[: len(argv) - len(args.training_script_args) - 1])
        capable = sorted(name for name, r in list_recipes().items() if r.supports_distributed)
        hint = f" Recipes that do: {', '.join(capable)}." if capable else ""
        raise RecipeError(
            f"recipe {recipe.name!r} does not support distributed runs (RECIPE_INFO in {recipe.path.name} says "
            f"supports_distributed: False), so torchrun flags ({flags}) cannot launch it. Drop them to run it in "
            f"one process.{hint}"
        )
    args.training_script = str(recipe.path)
    given_args = list(args.training_script_args)
    launcher_args = argv[: len(argv) - len(given_args) - 1]
    args.training_script_args = _config_args(recipe, given_args)
    check_before_start(args.training_script_args, recipe.path)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # a failed rank is reported once, below, in one line: the ranks leave it to this process (tune.config.parse
    # reads the variable) and torchrun's own failure log stays quiet
    os.environ[LAUNCHER_REPORTS_ERRORS] = "1"
    elastic_log = logging.getLogger("torch.distributed.elastic")
    level = elastic_log.level
    elastic_log.setLevel(logging.CRITICAL)
    started = time.time()
    try:
        torchrun.run(args)
    except ChildFailedError as err:
        print(f"tune: error: {_first_failure(err)}", file=sys.stderr)
        return 1
    finally:
        elastic_log.setLevel(level)
        os.environ.pop(LAUNCHER_REPORTS_ERRORS, None)
    report_run(recipe.name, given_args, args.training_script_args, started, launcher_args)
    return 0


def _first_failure(err: "ChildFailedError") -> str:  # noqa: F821 - imported with torch, where it is raised
    """One line for the first process that failed: its own error when it left one (a recipe's ``error:`` line,
    recorded by ``tune.config.parse``), else its exit status and where to look."""
    rank, failure = err.get_first_failure()
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    message = str(message or "")
    if message and "pytorch.org/docs/stable/elastic/errors" not in message:
        # a recorded TuneError reads "ConfigError: ..."; the class name says nothing to the user
        said = message.partition(": ")[2] if message.split(":", 1)[0].endswith("Error") else message
        return f"rank {rank} failed: {said}"
    how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit status {failure.exitcode}"
    return f"rank {rank} failed ({how}); its output above says why"


def report_run(
    recipe_name: str,
    given_args: Sequence[str],
    config_args: Sequence[str],
    started: float,
    launcher_args: Sequence[str] = (),
) -> None:
    """After a run that logged metrics: records how it ran, writes its report and says where both are.

    ``run.json`` gets the recipe, the config as given, the overrides, the times and the wall time (a resumed run
    adds its own entry), ``report.html`` the report of ``tune report OUTPUT_DIR``, both in the log directory
    (``output_dir`` when the log directory is outside it; see ``tune.training.RunLog.report_dir``), and stdout
    two lines naming the log and the report. A run without a JSON Lines metric log (generation,
    evaluation, a stdout-only logger) gets nothing. Whatever fails here is a warning: the run itself succeeded.

    Args:
        recipe_name (str): the recipe that ran.
        given_args (Sequence[str]): the recipe's arguments as typed (``--config NAME key=value ...``).
        config_args (Sequence[str]): the same with the config resolved to its file.
        started (float): unix time at which the recipe started.
        launcher_args (Sequence[str]): the torchrun flags of a distributed run, recorded with the command.
    """
    if len(config_args) < 2 or config_args[0] != "--config" or any(a in ("-h", "--help") for a in config_args):
        return
    if os.environ.get("RANK", "0") != "0":  # `tune run` inside a launcher of its own: rank 0 reports
        return
    output_dir = None
    try:
        cfg = load_config(config_args[1], config_args[2:])
        output_dir = cfg.get("output_dir")
        if not isinstance(output_dir, str) or not output_dir:
            return
        from tune.training import RUN_INFO_FILE, RunLogError, read_run_log, write_report  # torch is loaded by now

        try:
            run = read_run_log(output_dir)
        except RunLogError:
            return  # nothing was logged to a file
        info_file = run.report_dir / RUN_INFO_FILE
        run.info = {"runs": _run_entries(info_file, bool(cfg.get("resume_from_checkpoint")))}
        run.info["runs"].append(_run_entry(recipe_name, list(given_args), list(launcher_args), started))
        _write_json(info_file, run.info)
        report = write_report([run])
    except Exception as error:  # noqa: BLE001 - the run succeeded; its report is a convenience
        retry = f" `tune report {shlex.quote(str(output_dir))}` retries." if output_dir else ""
        print(
            f"tune: warning: could not write the run's report: {type(error).__name__}: {error}.{retry}", file=sys.stderr
        )
        return
    print(f"Metrics logged to {run.log_files[-1]}")
    print(
        f"Report: {report} (rebuild it with `tune report {shlex.quote(output_dir)}`; "
        f"compare runs with `tune report {shlex.quote(output_dir)} OTHER_OUTPUT_DIR ...`)"
    )


def _run_entries(path: Path, resumed: bool) -> list[dict]:
    # a resumed run continues the earlier ones; a fresh run (into an empty or a moved-aside output_dir) starts anew
    if not resumed or not path.is_file():
        return []
    try:
        runs = json.loads(path.read_text(encoding="utf-8")).get("runs")
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def _run_entry(recipe_name: str, given_args: list[str], launcher_args: list[str], started: float) -> dict:
    import tune

    config, overrides, i = None, [], 0
    while i < len(given_args):
        arg = given_args[i]
        if arg == "--config" and i + 1 < len(given_args):
            config, i = given_args[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config = arg.partition("=")[2]
        else:
            overrides.append(arg)
        i += 1
    finished = time.time()
    return {
        "recipe": recipe_name,
        "config": config,
        "overrides": overrides,
        "command": shlex.join(["tune", "run", *launcher_args, recipe_name, *given_args]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(finished)),
        "wall_seconds": round(finished - started, 3),
        "tune_version": tune.__version__,
    }


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
