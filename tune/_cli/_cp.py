"""``tune cp NAME DEST``: copies a shipped recipe (.py) or config (.yaml) to edit it."""

import argparse
import shutil
import sys
from pathlib import Path

from tune._cli._common import HelpFormatter, examples
from tune.config import TuneError, list_configs, list_recipes
from tune.config._discovery import close_names


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "cp",
        help="copy a recipe or config to edit it",
        description=(
            "Copy a recipe (a .py script) or a config (a .yaml file), built-in or from a plugin, to DEST.\n"
            "An existing directory as DEST receives the file under its own name; a DEST without a suffix gets\n"
            "the source's (.py or .yaml)."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune cp lora_finetune_single_device my_recipe.py",
            "tune cp llama3_2/1B_lora_single_device .            # -> ./1B_lora_single_device.yaml",
            "tune cp llama3_2/1B_lora_single_device exp/my --make-parents   # -> exp/my.yaml",
            "tune cp -n llama3_2/1B_lora_single_device my.yaml   # keep my.yaml if it exists",
        ),
    )
    parser.add_argument(
        "name", metavar="NAME", help="recipe or config name as `tune ls` shows it; e.g. llama3_2/1B_lora_single_device"
    )
    parser.add_argument(
        "dest", metavar="DEST", help="file or existing directory to copy to; e.g. my.yaml or ./configs/"
    )
    parser.add_argument(
        "--make-parents",
        action="store_true",
        help="create DEST's missing parent directories; e.g. `tune cp NAME runs/a/my.yaml --make-parents`",
    )
    parser.add_argument(
        "-n",
        "--no-clobber",
        action="store_true",
        help="do not overwrite an existing DEST (say so and exit 0); e.g. `tune cp -n NAME my.yaml`",
    )


def run(args: argparse.Namespace) -> int:
    source = _source(args.name)
    dest = Path(args.dest).expanduser()
    if dest.is_dir() or args.dest.endswith(("/", "\\")):
        dest = dest / source.name
    elif not dest.suffix:
        dest = dest.with_suffix(source.suffix)
    elif dest.suffix != source.suffix:
        print(f"tune: warning: copying a {source.suffix} file to a {dest.suffix} name: {dest}", file=sys.stderr)
    if dest.exists() and args.no_clobber:
        print(f"not copied: {dest} already exists (--no-clobber)", file=sys.stderr)
        return 0
    if not dest.parent.is_dir():
        if not args.make_parents:
            raise TuneError(f"directory {dest.parent.resolve()} does not exist; pass --make-parents to create it")
        dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    print(f"Copied {args.name} to {dest}")
    return 0


def _source(name: str) -> Path:
    recipes = list_recipes()
    if name in recipes:
        return recipes[name].path
    configs = list_configs()
    if name in configs:
        return configs[name]
    hint = close_names(name, sorted(set(recipes) | set(configs)))
    raise TuneError(f"no recipe or config named {name!r}{hint} (`tune ls` lists them)")
