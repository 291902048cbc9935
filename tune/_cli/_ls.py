"""``tune ls [FILTER] [--models]``: recipes with their configs, or the registered model families."""

import argparse
import sys

from tune._cli._common import HelpFormatter, examples, print_table
from tune.config import builtin_configs, configs_of, list_recipes


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "ls",
        help="list recipes and their configs (built-in and from plugins)",
        description=(
            "List every recipe with the configs it runs, and whether it supports distributed runs\n"
            "(`tune run --nproc_per_node N ...`). Built-in recipes and configs are read from the files shipped\n"
            "with tune; recipes of installed plugins (entry-point group `tune.plugins`) are listed too."
        ),
        formatter_class=HelpFormatter,
        epilog=examples("tune ls", "tune ls lora", "tune ls qwen2_5/", "tune ls --models", "tune ls --models qwen"),
    )
    parser.add_argument(
        "filter",
        nargs="?",
        default="",
        metavar="FILTER",
        help="show only recipes, configs (or with --models, families and builders) whose name contains FILTER, "
        "case-insensitive; e.g. `tune ls lora`",
    )
    parser.add_argument(
        "--models",
        action="store_true",
        help="list the registered model families (built-in and from plugins) instead; e.g. `tune ls --models`",
    )


def run(args: argparse.Namespace) -> int:
    needle = args.filter.lower()
    if args.models:
        return _list_models(needle)
    recipes = list_recipes()
    configs = builtin_configs()
    rows, claimed = [], set()
    for name, recipe in sorted(recipes.items(), key=lambda item: (item[1].source != "built-in", item[0])):
        names = sorted(configs_of(recipe, configs))
        claimed.update(names)
        if needle and needle not in name.lower():
            names = [c for c in names if needle in c.lower()]
            if not names:
                continue
        label = name if recipe.source == "built-in" else f"{name} (plugin)"
        distributed = "yes" if recipe.supports_distributed else "no"
        rows.append((label, distributed, names[0] if names else "-"))
        rows += [("", "", c) for c in names[1:]]
    # a config no recipe claims is a packaging mistake; show it instead of hiding it
    orphans = sorted(c for c in configs if c not in claimed and needle in c.lower())
    if orphans:
        rows.append(("(no recipe)", "-", orphans[0]))
        rows += [("", "", c) for c in orphans[1:]]
    if not rows:
        what = f"matching {args.filter!r}" if needle else "installed"
        print(f"no recipe or config {what}", file=sys.stderr)
        return 0
    print_table(("RECIPE", "DISTRIBUTED", "CONFIG"), rows)
    return 0


def _list_models(needle: str) -> int:
    from tune.registry import list_model_families

    rows = []
    for name, family in list_model_families().items():
        builders = sorted(family.builders)
        if needle and needle not in name.lower():
            builders = [b for b in builders if needle in b.lower()]
            if not builders:
                continue
        hf_types = ", ".join(family.hf_model_types) or "-"
        rows.append((name, hf_types, ", ".join(builders) or "-"))
    if not rows:
        print("no model family " + (f"matching {needle!r}" if needle else "registered"), file=sys.stderr)
        return 0
    print_table(("FAMILY", "HF MODEL TYPES", "BUILDERS"), rows)
    return 0
