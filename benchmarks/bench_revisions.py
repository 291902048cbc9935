"""Two revisions of tune on the peer harness's recipe benchmark, interleaved run by run: did a change slow tune down?

Command (from the repository root; the baseline is any earlier checkout, e.g. a git worktree):

    git worktree add /tmp/tune_baseline REV
    .venv/bin/python benchmarks/bench_revisions.py --baseline /tmp/tune_baseline --reps 2 \\
        --rows lora_qv_small:unpacked,lora_qv_small:packed,full_medium:packed --steps-small 30 --steps-medium 12

Each row runs the harness's torchtune config under the baseline's recipes and under this tree's (both with this
tree's virtualenv), alternating which goes first from one repetition to the next, through the same runner as
``bench_recipes.py`` (same configs, overrides, token counting and peak-RSS measurement). It prints tokens/s of
both, their ratio, peak RSS and the last step's loss of each (equal when the change keeps the numerics), and
writes the runs to ``--output``.
"""

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _runner(tree: Path, name: str) -> ModuleType:
    # bench_recipes of a tree runs that tree's tune (its ROOT goes first on PYTHONPATH)
    spec = importlib.util.spec_from_file_location(name, tree / "benchmarks" / "bench_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the revision to compare with")
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench", help="the peer harness")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "recipes")
    parser.add_argument("--rows", required=True, help="comma list of <recipe>_<size>:<unpacked|packed>")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps-small", type=int, default=30)
    parser.add_argument("--steps-medium", type=int, default=12)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "bench_revisions.json")
    args = parser.parse_args()
    current, baseline = _runner(ROOT, "bench_current"), _runner(args.baseline.resolve(), "bench_baseline")
    rows = [tuple(row.split(":")) for row in args.rows.split(",")]
    sizes = sorted({name.rsplit("_", 1)[1] for name, _ in rows})
    bench = current._prepare(args.harness.resolve(), args.workdir.resolve(), sizes)
    steps = {"small": args.steps_small, "medium": args.steps_medium}
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for rep in range(args.reps):
        for name, data in rows:
            order = [("baseline", baseline), ("current", current)]
            for label, runner in order if rep % 2 == 0 else order[::-1]:
                size = name.rsplit("_", 1)[1]
                run = runner._run("tune", sys.executable, bench, name, steps[size], data == "packed", rep, [])
                runs.setdefault((name, data, label), []).append(run)
                print(f"rep {rep + 1}: {label} {name} {data}: {run['tokens_per_second']:,.0f} tok/s", flush=True)
    print(f"\n{args.reps} rep(s), steps small {steps['small']}, medium {steps['medium']}; baseline {args.baseline}")
    print(
        "| row | data | baseline tok/s | current tok/s | current / baseline | peak RSS MiB (baseline / current) "
        "| last loss (baseline / current) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, data in rows:
        old, new = runs[(name, data, "baseline")], runs[(name, data, "current")]
        old_tps = statistics.mean(r["tokens_per_second"] for r in old)
        new_tps = statistics.mean(r["tokens_per_second"] for r in new)
        rss = f"{max(r['peak_rss_mib'] for r in old):.0f} / {max(r['peak_rss_mib'] for r in new):.0f}"
        loss = f"{old[-1]['loss_last']:.4f} / {new[-1]['loss_last']:.4f}"
        print(f"| {name} | {data} | {old_tps:,.0f} | {new_tps:,.0f} | {new_tps / old_tps:.3f} | {rss} | {loss} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"|".join(k): v for k, v in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
