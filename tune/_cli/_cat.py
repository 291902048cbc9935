"""``tune cat CONFIG``: prints a shipped (or plugin) config, comments included."""

import argparse

from tune._cli._common import HelpFormatter, examples
from tune.config import find_config, list_recipes
from tune.config._errors import ConfigError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "cat",
        help="print a config",
        description="Print a config shipped with tune or with a plugin, as written (comments included).",
        formatter_class=HelpFormatter,
        epilog=examples("tune cat llama3_2/1B_lora_single_device", "tune cat qwen2_5/0.5B_full_single_device | less"),
    )
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="config name as `tune ls` shows it (or a file); e.g. llama3_2/1B_lora_single_device",
    )


def run(args: argparse.Namespace) -> int:
    try:
        path = find_config(args.config)
    except ConfigError:
        if args.config in list_recipes():
            raise ConfigError(
                f"{args.config!r} is a recipe, not a config: `tune cp {args.config} .` copies it"
            ) from None
        raise
    print(path.read_text(encoding="utf-8"), end="")
    return 0
