"""``tune validate CONFIG [--recipe NAME] [--show-sample N] [key=value ...]``."""

import argparse
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from tune._cli import _estimate
from tune._cli._common import HelpFormatter, IntermixedArgumentParser, examples
from tune.config import (
    ConfigProblem,
    RecipeInfo,
    TuneError,
    find_config,
    find_recipe,
    instantiate,
    load_config,
    read_recipe_info,
    recipe_defaults,
    recipes_for_config,
    resolved_yaml,
    shipped_config_name,
    validate_config,
)
from tune.config._recipe_scan import scan_recipe
from tune.config._training import DEFAULT_NOTES, optional_key_tables


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a config without running anything",
        description=(
            "Check a config without running the recipe or building a model, and report every problem with its\n"
            "key path and value: YAML syntax errors (with line numbers), interpolations that do not resolve,\n"
            "`???` values left unset, `_component_` paths that do not import (anywhere in the tree), arguments\n"
            "a component does not accept or misses (counting those the recipe passes at run time), and keys the\n"
            "recipe reads that the config lacks. The modules listed under `imports:` are imported first.\n"
            "`model_converters` are checked for their order; `finetuning_schedule` phases are checked, and their\n"
            "parameter patterns matched against the model built on the meta device (no memory, no weights).\n"
            "Exit status 0 with one OK line, or 1 with the list."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune validate llama3_2/1B_lora_single_device",
            "tune validate my.yaml --recipe lora_finetune_single_device",
            "tune validate my.yaml --recipe ./my_recipe.py optimizer.lr=1e-4 ~profiler",
            "tune validate my.yaml --recipe lora_finetune_single_device --show-sample 0",
            "tune validate llama3_2/1B_lora_single_device --show-defaults",
            "tune validate llama3_2/1B_full_single_device --estimate --device-memory 24GiB",
        ),
    )
    parser.__class__ = IntermixedArgumentParser  # built by `subparsers`, which takes no parser class per command
    parser.add_argument(
        "config", metavar="CONFIG", help="config name or YAML file; e.g. llama3_2/1B_lora_single_device or my.yaml"
    )
    parser.add_argument(
        "--recipe",
        metavar="NAME",
        help="recipe the config is for (built-in name, plugin name or .py path); defaults to the recipe that "
        "claims a shipped config. Without one, arguments the recipe would pass and keys it reads are not "
        "checked; e.g. --recipe lora_finetune_single_device",
    )
    parser.add_argument(
        "--show-sample",
        type=int,
        metavar="N",
        help="after a clean check, build the config's tokenizer and dataset and print sample N as text with "
        "the trained tokens between [[ and ]]; e.g. --show-sample 0",
    )
    parser.add_argument(
        "--show-defaults",
        action="store_true",
        help="after a clean check, print the optional keys the recipe reads with the values they will take, "
        "from the config or from the recipe's defaults (tune.config.OPTIONAL_KEYS); e.g. --show-defaults",
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="after a clean check, print the peak memory per device as `tune estimate` does (with the options "
        "below); e.g. --estimate --device-memory 24GiB",
    )
    _estimate.add_estimate_arguments(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],  # optional: without a default, argparse would list it as required when CONFIG is missing
        metavar="key=value",
        help="overrides applied before checking; e.g. batch_size=8 ~profiler",
    )


def run(args: argparse.Namespace) -> int:
    path = find_config(args.config)
    recipe = _recipe(args)
    problems = validate_config(path, recipe.path if recipe else None, args.overrides)
    problems += _check_schedule_patterns(path, args.overrides, problems)
    against = f" for recipe {recipe.name}" if recipe else ""
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        print(f"{args.config}: {count}{against}:")
        for problem in problems:
            text = str(problem).replace("\n", "\n    ")  # a problem's own lines, indented under its bullet
            print(f"  - {text}")
        return 1
    if recipe is None:
        print(
            "note: no recipe given (--recipe NAME): arguments the recipe passes and keys it reads were not checked",
            file=sys.stderr,
        )
    print(f"OK: {args.config} is valid{against}")
    _note_missing_device(path, args.overrides)
    if args.show_defaults:
        print(_defaults_report(path, args.overrides, recipe))
    if args.show_sample is not None:
        print(_sample(path, args.overrides, args.show_sample, recipe))
    if args.estimate:
        report = _estimate.estimate_config(
            args.config,
            args.overrides,
            recipe=args.recipe,
            world_size=args.nproc_per_node * args.nnodes,
            device_memory=args.device_memory,
            baseline=not args.no_baseline,
        )
        _estimate.print_report(report)
    return 0


def _note_missing_device(path: Path, overrides: list[str]) -> None:
    """A valid config may be meant for another machine: say so when its device is not on this one."""
    from tune.utils import device_problem

    device = load_config(path, overrides).get("device")
    message = device_problem(device, check_present=True)
    if message:
        print(f"note: device={device}: {message}; `tune run` refuses it on this machine", file=sys.stderr)


def _check_schedule_patterns(path: Path, overrides: list[str], found: list[ConfigProblem]) -> list[ConfigProblem]:
    """The ``finetuning_schedule`` patterns matched against the model, built on the meta device."""
    import torch

    from tune import training

    try:
        cfg = load_config(path, overrides)  # its `imports:` were imported by validate_config
    except TuneError:
        return []  # reported by validate_config already
    if cfg.get("finetuning_schedule", None) is None or "model" not in cfg:
        return []
    if any(p.key.split(".")[0].split("[")[0] in ("model", "finetuning_schedule") for p in found):
        return []  # the model's or the schedule's own problems are listed
    schedule = training.FinetuningSchedule(cfg.finetuning_schedule, cfg.get("finetuning_schedule_auto_transition"))
    try:
        with torch.device("meta"):  # parameter names only: nothing is allocated, no weights are read
            model = instantiate(cfg.model)
    except Exception as err:  # noqa: BLE001 - a builder that cannot run on meta leaves the patterns unchecked
        print(
            "note: finetuning_schedule patterns were not checked against the model, which could not be built on the "
            f"meta device ({type(err).__name__}: {err}); the phases' syntax was checked",
            file=sys.stderr,
        )
        return []
    try:
        schedule.validate(model)
    except ValueError as err:
        return [ConfigProblem("finetuning_schedule", str(err))]
    return []


def _defaults_report(path: Path, overrides: list[str], recipe: RecipeInfo | None) -> str:
    """The optional keys the recipe reads, each with the value it will use and where that comes from."""
    if recipe is None:
        return "no recipe: no optional keys to show (name one with --recipe NAME)"
    tables = optional_key_tables(read_recipe_info(recipe.path))
    if not tables:
        return f"recipe {recipe.name} declares no optional keys (RECIPE_INFO['optional_keys'])"
    cfg = load_config(path, overrides)
    lines = [f"optional keys of {recipe.name} (tables: {', '.join(tables)}):"]
    for key, default in recipe_defaults(tables).items():
        if key in cfg:
            value, origin = cfg[key], "config"
            if isinstance(value, (DictConfig, ListConfig)):  # resolved here, where `${output_dir}` is known
                value = OmegaConf.to_container(value, resolve=True)
        else:
            value, origin = default, "default"
        text = resolved_yaml(OmegaConf.create({key: value})).strip().replace("\n", "\n    ")
        note = f": {DEFAULT_NOTES[key]}" if value is None and key in DEFAULT_NOTES else ""
        lines.append(f"  {text}  # {origin}{note}")
    return "\n".join(lines)


def _recipe(args: argparse.Namespace) -> RecipeInfo | None:
    if args.recipe:
        return find_recipe(args.recipe)
    name = args.config
    if Path(name).is_file():
        name = shipped_config_name(Path(name))  # `tune validate configs/x/y.yaml` in a checkout means config x/y
        if name is None:
            return None
    claiming = recipes_for_config(name)
    if len(claiming) > 1:
        names = ", ".join(r.name for r in claiming)
        raise TuneError(f"several recipes claim {name!r} ({names}); choose one with --recipe NAME")
    return claiming[0] if claiming else None


def _sample(path: Path, overrides: list[str], index: int, recipe: RecipeInfo | None) -> str:
    from tune.data import CROSS_ENTROPY_IGNORE_IDX, render_sample  # imports torch: only for --show-sample

    cfg = load_config(path, overrides)
    for key in ("tokenizer", "dataset"):
        if key not in cfg:
            raise TuneError(f"--show-sample needs `{key}` in the config")
    tokenizer = instantiate(cfg.tokenizer)
    if _tokenizer_by_keyword(recipe):
        datasets = instantiate(cfg.dataset, tokenizer=tokenizer)
    else:
        datasets = instantiate(cfg.dataset, tokenizer)
    datasets = datasets if isinstance(datasets, list) else [datasets]
    item = _item(datasets, index)
    if not isinstance(item, dict) or "tokens" not in item or "labels" not in item:
        got = sorted(item) if isinstance(item, dict) else type(item).__name__
        raise TuneError(f"sample {index} has no `tokens` and `labels` to show (got {got})")
    tokens, labels = _as_list(item["tokens"]), _as_list(item["labels"])
    num_trained = sum(label != CROSS_ENTROPY_IGNORE_IDX for label in labels)
    header = f"sample {index}: {len(tokens)} tokens, {num_trained} trained (shown between [[ and ]])"
    return header + "\n" + render_sample(tokens, labels, lambda ids: _decode(tokenizer, ids))


def _tokenizer_by_keyword(recipe: RecipeInfo | None) -> bool:
    """Whether the recipe passes the tokenizer to the dataset as ``tokenizer=`` (else positionally)."""
    if recipe is None:
        return False
    args = scan_recipe(recipe.path).runtime_args
    found = [a for path, a in args.items() if path and path[0] == "dataset"]
    return any("tokenizer" in a.keywords for a in found) and not any(a.num_positional for a in found)


def _item(datasets: list[Any], index: int) -> Any:
    total = 0
    for dataset in datasets:
        size = len(dataset)
        if index < total + size:
            return dataset[index - total]
        total += size
    raise TuneError(f"--show-sample {index}: the dataset has {total} samples (0 to {total - 1})")


def _as_list(values: Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _decode(tokenizer: Any, ids: list[int]) -> str:
    try:  # show special tokens too: they are part of what is trained
        return tokenizer.decode(ids, skip_special_tokens=False)
    except TypeError:
        return tokenizer.decode(ids)
