"""LoRA DPO throughput and peak memory of tune's ``lora_dpo_single_device``, side by side with torchtune 0.6.1's.

One command (from the repository root, after the peer harness's torchtune environment exists; see
benchmarks/README.md)::

    .venv/bin/python benchmarks/bench_dpo.py --torchtune-python /tmp/bench/.venvs/tt/bin/python --reps 3

What runs: the harness's ``lora_all_{small,medium}`` torchtune configs (Llama-shaped ~7M / ~64M-parameter
checkpoints, LoRA on every projection, batch 4, seq <= 512, fp32 on CPU, fused AdamW), turned into DPO configs:
``lora_dpo_single_device``, ``torchtune.rlhf.loss.DPOLoss`` (beta 0.1), and a preference dataset made from the
harness's Alpaca file (``torchtune.datasets.preference_dataset`` over a JSON file written here: each row's user
turn is its instruction and input, the chosen answer its output, the rejected answer the output of the row
after it). torchtune runs the config as it is (with the harness's timing logger); tune runs the same file with
``torchtune.`` replaced by ``tune.`` and the logger swapped for tune's DiskLogger. Runs alternate between the
systems. ``--tune-root NAME=PATH`` (repeatable) runs tune from other copies of the repository as systems of their
own, interleaved with the rest: a change measured against the code before it, e.g.::

    .venv/bin/python benchmarks/bench_dpo.py --torchtune-python /tmp/bench/.venvs/tt/bin/python --reps 2 \
        --tune-root before=/tmp/dpo_before --tune-root after=/tmp/dpo_after

Definitions: pairs/s = preference pairs (batch size x optimizer steps) of steps 4..N over their wall time, from
each system's per-step timestamps (both log right after the optimizer step). The two recipes count tokens
differently (torchtune: every position of the padded batch, tune: non-padding tokens), so the ratio is taken on
pairs/s; tune's non-padding tokens/s is shown too. Peak RSS from ``wait4``. Prints a markdown table, writes JSON.
"""

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_recipes as common  # noqa: E402 (the harness plumbing shared with the SFT benchmark)

ROOT = common.ROOT
WARMUP_STEPS = common.WARMUP_STEPS
BATCH_SIZE = 4


def _pairs_file(bench: Path) -> Path:
    """The preference pairs, from the harness's Alpaca rows (written once)."""
    path = bench / "work" / "assets" / "dpo_pairs.json"
    if not path.is_file():
        rows = json.loads((bench / "work" / "assets" / "alpaca_synth.json").read_text())
        pairs = []
        for row, other in zip(rows, rows[1:] + rows[:1]):
            prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
            user = {"role": "user", "content": prompt}
            pairs.append(
                {
                    "chosen": [user, {"role": "assistant", "content": row["output"]}],
                    "rejected": [user, {"role": "assistant", "content": other["output"]}],
                }
            )
        path.write_text(json.dumps(pairs))
    return path


def _dpo_config(bench: Path, size: str, system: str) -> Path:
    """The harness's lora_all config of ``size`` as a LoRA DPO config for ``system``."""
    text = (bench / "configs" / "torchtune" / f"lora_all_{size}.yaml").read_text()
    head, _, rest = text.partition("\ndataset:\n")
    _, _, rest = rest.partition("\nseed:")
    dataset = (
        "\ndataset:\n  _component_: torchtune.datasets.preference_dataset\n  source: json\n"
        f"  data_files: {_pairs_file(bench)}\n  split: train\n"
    )
    text = head + dataset + "seed:" + rest
    text = text.replace(
        "_component_: torchtune.modules.loss.CEWithChunkedOutputLoss", "_component_: torchtune.rlhf.loss.DPOLoss"
    )
    if system == "tune":
        text = text.replace("torchtune.", "tune.")
        text = text.replace("_component_: bench_metric_logger.TimedDiskLogger", "_component_: tune.training.DiskLogger")
    path = bench / "configs" / "dpo" / f"{system}_lora_dpo_{size}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _steps(system: str, out: Path) -> list[tuple[int, float, float]]:
    """(step, timestamp, tokens/s as the system counts them) per logged step."""
    if system == "torchtune":
        return common._steps(system, out)
    records = [json.loads(line) for line in (out / "logs" / "log.txt").read_text().splitlines()]
    return [(r["step"], r["time"], r["tokens_per_second"]) for r in records if "tokens_per_second" in r]


def _run(system: str, python: str, bench: Path, size: str, steps: int, rep: int, root: Path = ROOT) -> dict:
    import os

    config = _dpo_config(bench, size, "torchtune" if system == "torchtune" else "tune")
    out = Path("work") / "runs" / f"{system}_lora_dpo_{size}_{rep}"
    # a run of an earlier invocation would add its steps to the log read below (the DiskLogger appends)
    shutil.rmtree(bench / out, ignore_errors=True)
    overrides = [f"output_dir={out}", f"max_steps_per_epoch={steps}", f"batch_size={BATCH_SIZE}"]
    module = "torchtune._cli.tune" if system == "torchtune" else "tune._cli.main"
    paths = [str(root), str(bench / "tt_ext"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(bench / "work" / "hf_home"))
    command = [python, "-m", module, "run", "lora_dpo_single_device", "--config", str(config), *overrides]
    status, tail, peak_mib = common._run_process(command, bench, env, bench / "work" / "logs" / f"{out.name}.log")
    if status != 0:
        print(tail, file=sys.stderr)
        raise SystemExit(f"{system} lora_dpo {size} failed with exit status {status}")
    logged = _steps(system, bench / out)
    window = logged[WARMUP_STEPS - 1 :]
    seconds = window[-1][1] - window[0][1]
    result = {"pairs_per_second": BATCH_SIZE * (len(window) - 1) / seconds, "peak_rss_mib": peak_mib}
    if system != "torchtune":
        result["tokens_per_second"] = common._throughput(logged)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench", help="the peer harness")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "dpo")
    parser.add_argument("--torchtune-python", help="python of an environment with torchtune 0.6.1 (harness .venvs/tt)")
    parser.add_argument("--sizes", default="small,medium", help="comma list of small, medium")
    parser.add_argument("--steps-small", type=int, default=40)
    parser.add_argument("--steps-medium", type=int, default=12)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--tune-root",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="run tune from the checkout (or copy of tune/, recipes/, configs/, pyproject.toml) at PATH as system "
        "NAME, e.g. before=/tmp/before after=/tmp/after (repeatable; default: this checkout as 'tune')",
    )
    args = parser.parse_args()
    steps = {"small": args.steps_small, "medium": args.steps_medium}
    if min(steps.values()) <= WARMUP_STEPS + 1:
        parser.error(f"steps must be above {WARMUP_STEPS + 1}: the first {WARMUP_STEPS} steps are warm-up")
    sizes = args.sizes.split(",")
    roots = dict(item.split("=", 1) for item in args.tune_root) or {"tune": str(ROOT)}
    roots = {name: Path(path).resolve() for name, path in roots.items()}
    systems = dict.fromkeys(roots, sys.executable)
    if args.torchtune_python:
        systems["torchtune"] = args.torchtune_python
    bench = common._prepare(args.harness.resolve(), args.workdir.resolve(), sizes)
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.reps):
        for size in sizes:
            for system, python in systems.items():
                print(f"rep {rep + 1}: {system} lora_dpo {size} ...", flush=True)
                root = roots.get(system, ROOT)
                results.setdefault((size, system), []).append(_run(system, python, bench, size, steps[size], rep, root))
    lines = [
        f"LoRA DPO, batch {BATCH_SIZE} pairs, steps small {steps['small']} / medium {steps['medium']}, "
        f"{args.reps} rep(s); pairs/s over steps {WARMUP_STEPS + 1}..N, mean over reps; ratio = tune / torchtune",
        "",
        "| size | system | pairs/s | pairs/s ratio | tune tokens/s (non-padding) | peak RSS MiB | RSS ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for size in sizes:
        means = {
            system: {
                key: statistics.mean(r[key] for r in results[(size, system)]) for key in results[(size, system)][0]
            }
            for system in systems
        }
        for system, mean in means.items():
            peer = means.get("torchtune")
            ratio = (
                f"{mean['pairs_per_second'] / peer['pairs_per_second']:.2f}" if peer and system != "torchtune" else "-"
            )
            rss = f"{mean['peak_rss_mib'] / peer['peak_rss_mib']:.2f}" if peer and system != "torchtune" else "-"
            tokens = f"{mean['tokens_per_second']:,.0f}" if "tokens_per_second" in mean else "-"
            lines.append(
                f"| {size} | {system} | {mean['pairs_per_second']:.2f} | {ratio} | {tokens} "
                f"| {mean['peak_rss_mib']:,.0f} | {rss} |"
            )
            rows.append({"size": size, "system": system, **mean, "runs": results[(size, system)]})
    table = "\n".join(lines)
    print(table)
    output = args.workdir / "bench_dpo.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"steps": steps, "rows": rows}, indent=2))
    output.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
