"""Writes docs/memory_table.md: the estimated peak memory per device of every shipped training config.

Each row is `tune estimate CONFIG` at the config's own settings (batch size, sequence length, activation
checkpointing, ...), baseline included: single-device recipes on one device, distributed ones on one node of 8.
"Fits on" is the smallest of the usual accelerator sizes that holds the peak. Models are built on the meta device,
so no weights are needed.

    python tools/memory_table.py           # rewrite docs/memory_table.md
    python tools/memory_table.py --check   # exit 1 when the committed table differs from what the configs give

tests/test_docs_memory_table.py runs the check.
"""

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the configs and tune of this checkout, whichever tune is installed

from tune._cli._estimate import estimate_config  # noqa: E402
from tune.config import TuneError, builtin_configs, builtin_recipes, read_recipe_info, recipes_for_config  # noqa: E402

TABLE = ROOT / "docs" / "memory_table.md"
DISTRIBUTED_RANKS = 8
DEVICE_SIZES_GIB = (8, 16, 24, 32, 40, 48, 80, 96, 141, 192)
HEADER = """# Estimated memory of the shipped configs

Written by `python tools/memory_table.py` from `tune estimate` (do not edit by hand; tests/test_docs_memory_table.py
checks it is current). Each row is the estimated peak memory per device at the config's own settings: its batch
size, `tokenizer.max_seq_len`, activation checkpointing and offloading, optimizer and dtype; single-device recipes on
one device, distributed recipes on {ranks} ranks (`tune run --nproc_per_node {ranks}`). It includes the baseline (a
CUDA context of 0.7 GiB; for `device: cpu` configs, the process's libraries and the CPU allocator's overhead). "Fits
on" is the smallest of {sizes} GiB that holds it; "(approx.)" marks a model with layers that could not be traced on
the meta device (vision fusion layers, routed experts), whose activations are a rough per-layer formula. How the
terms are computed and how close they come to measured runs: [memory_and_speed.md](memory_and_speed.md) and
[benchmarks/README.md](../benchmarks/README.md). For other settings, or to see what would make a config fit:
`tune estimate CONFIG --device-memory 24GiB [key=value ...]`.

| config | recipe | method | ranks | peak per device | fits on |
|---|---|---|---|---|---|
"""


def training_configs() -> list[tuple[str, str]]:
    """(config, recipe) for every shipped config that a training recipe claims, sorted."""
    training = {
        name: recipe
        for name, recipe in builtin_recipes().items()
        if "finetune" in (read_recipe_info(recipe.path) or {}).get("optional_keys", [])
    }
    rows = []
    for config in sorted(builtin_configs()):
        claiming = [r for r in recipes_for_config(config) if r.name in training]
        if len(claiming) == 1:
            rows.append((config, claiming[0].name))
    return rows


def _fits_on(peak: int) -> str:
    for size in DEVICE_SIZES_GIB:
        if peak <= size * 2**30:
            return f"{size} GiB"
    return f"> {DEVICE_SIZES_GIB[-1]} GiB"


def row(config: str, recipe: str) -> str:
    """One table row: the config's estimate, or why there is none."""
    ranks = DISTRIBUTED_RANKS if "distributed" in recipe else 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = estimate_config(config, [], recipe=recipe, world_size=ranks, device_memory=None, suggest=False)
    except TuneError as err:
        reason = str(err).splitlines()[0].split(": pass ")[0]  # the error, without its how-to-fix sentence
        return f"| {config} | {recipe} | | {ranks} | not estimated: {reason} | |"
    peak, method = report.estimate.peak, report.settings.method
    if any("approximated" in note for note in report.estimate.notes):
        method += " (approx.)"
    return f"| {config} | {recipe} | {method} | {ranks} | {peak / 2**30:.1f} GiB | {_fits_on(peak)} |"


def render() -> str:
    """The whole page."""
    sizes = ", ".join(str(s) for s in DEVICE_SIZES_GIB)
    lines = [row(config, recipe) for config, recipe in training_configs()]
    return HEADER.format(ranks=DISTRIBUTED_RANKS, sizes=sizes) + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/memory_table.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if TABLE.read_text(encoding="utf-8") != text:
            print(f"{TABLE.relative_to(ROOT)} is stale: run python tools/memory_table.py", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE.relative_to(ROOT)} ({text.count(chr(10)) - HEADER.count(chr(10))} configs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
