"""``tune validate CONFIG [--recipe NAME] [--show-sample N] [key=value ...]``."""

import argparse
import sys
from pathlib import Path
from typing import Any

from tune._cli._common import HelpFormatter, examples
from tune._cli._sample import render_sample
from tune.config import (
    RecipeInfo,
    TuneError,
    find_config,
    find_recipe,
    instantiate,
    load_config,
    recipes_for_config,
    shipped_config_name,
    validate_config,
)
from tune.config._recipe_scan import scan_recipe

IGNORE_INDEX = -100  # labels equal to it get no loss (tune.data.CROSS_ENTROPY_IGNORE_IDX)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check a config without running anything",
        description=(
            "Check a config without running the recipe or building a model, and report every problem with its\n"
            "key path and value: YAML syntax errors (with line numbers), interpolations that do not resolve,\n"
            "`???` values left unset, `_component_` paths that do not import (anywhere in the tree), arguments\n"
            "a component does not accept or misses (counting those the recipe passes at run time), and keys the\n"
            "recipe reads that the config lacks. Exit status 0 with one OK line, or 1 with the list."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune validate llama3_2/1B_lora_single_device",
            "tune validate my.yaml --recipe lora_finetune_single_device",
            "tune validate my.yaml --recipe ./my_recipe.py optimizer.lr=1e-4 ~profiler",
            "tune validate my.yaml --recipe lora_finetune_single_device --show-sample 0",
        ),
    )
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
        "overrides",
        nargs="*",
        metavar="key=value",
        help="overrides applied before checking; e.g. batch_size=8 ~profiler",
    )


def run(args: argparse.Namespace) -> int:
    path = find_config(args.config)
    recipe = _recipe(args)
    problems = validate_config(path, recipe.path if recipe else None, args.overrides)
    against = f" for recipe {recipe.name}" if recipe else ""
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        print(f"{args.config}: {count}{against}:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    if recipe is None:
        print(
            "note: no recipe given (--recipe NAME): arguments the recipe passes and keys it reads were not checked",
            file=sys.stderr,
        )
    print(f"OK: {args.config} is valid{against}")
    if args.show_sample is not None:
        print(_sample(path, args.overrides, args.show_sample, recipe))
    return 0


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
    trained = [label != IGNORE_INDEX for label in labels]
    return f"sample {index}: " + render_sample(tokens, trained, lambda ids: _decode(tokenizer, ids))


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
