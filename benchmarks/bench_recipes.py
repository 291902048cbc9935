"""Fine-tuning throughput and peak memory of tune's single-device recipes, side by side with torchtune 0.6.1.

One command (run from the repository root; the harness is the peer benchmark harness in ../shared/bench, whose
``bash setup_venvs.sh`` makes the torchtune 0.6.1 environment ``.venvs/tt``; see benchmarks/README.md)::

    cp -r ../shared/bench /tmp/bench && (cd /tmp/bench && bash setup_venvs.sh)      # once: torchtune's venv
    .venv/bin/python benchmarks/bench_recipes.py --torchtune-python /tmp/bench/.venvs/tt/bin/python \\
        --sizes small,medium --reps 3

Quick look (short runs, one repetition): ``--reps 1 --steps-small 20 --steps-medium 8``. Without
``--torchtune-python`` only tune is measured.

What runs: the harness's torchtune configs (``configs/torchtune/{lora_qv,lora_all,full}_{small,medium}.yaml``:
Llama-shaped ~7M and ~64M-parameter Hugging Face checkpoints, batch 4, seq <= 512, fp32, CPU, AdamW fused, chunked
cross-entropy, compile off). torchtune runs them as they are (with the harness's timing logger); tune runs the same
files with ``torchtune.`` replaced by ``tune.`` and the metric logger swapped for ``tune.training.DiskLogger``,
nothing else changed. ``packed`` rows add ``dataset.packed=True`` for both systems. Every run is its own process;
runs are interleaved (rep -> size -> recipe -> unpacked/packed -> system) so the machine's speed drifts hit both
systems alike. ``--variant NAME:KEY=VALUE[;KEY=VALUE]`` adds a tune system with extra overrides on the unpacked
rows (e.g. ``--variant padded:collate_fn=tune.data.padded_collate_sft``: the padded batches that the recipes'
CPU default, ``tune.data.padding_free_collate``, replaces).

Definitions (the harness's): tokens/s = non-padding tokens of steps 4..N over their wall time, from each system's
per-step log (timestamp and its own tokens/s: tokens of step i = tokens/s_i x (t_i - t_{i-1})); peak RSS = the
process's maximum resident set size (``wait4``); MFU = k * N * tokens/s / ceiling with k = 6 for full fine-tuning
and 4 for LoRA, N = non-embedding parameters, ceiling = the harness's ``matmul_ceiling.py`` (best median fp32
``torch.mm`` rate over model-like shapes, same thread count), measured before and after the matrix, the larger
taken. Ratios are tune / torchtune of the means over repetitions. Prints a markdown table; writes JSON and the
table next to the runs (``--output``). ``--merge A.json B.json ...`` prints one table from several result files
(e.g. subsets run in parallel on separate cores).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {  # harness recipe name -> (our recipe, FLOPs per parameter per token)
    "lora_qv": ("lora_finetune_single_device", 4),
    "lora_all": ("lora_finetune_single_device", 4),
    "full": ("full_finetune_single_device", 6),
}
WARMUP_STEPS = 3


def _prepare(harness: Path, workdir: Path, sizes: list[str]) -> Path:
    bench = workdir / "bench"
    if not bench.exists():
        shutil.copytree(harness, bench, ignore=shutil.ignore_patterns(".venvs", "work"))
        for path in bench.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
    assets = bench / "work" / "assets"
    missing = [s for s in sizes if not (assets / f"llama-{s}").is_dir()]
    if missing or not (assets / "alpaca_synth.json").is_file():
        print(f"building the harness assets ({', '.join(sizes)}) in {assets} ...", flush=True)
        subprocess.run([sys.executable, "make_assets.py", "--sizes", ",".join(sizes)], cwd=bench, check=True)
    return bench


def _matmul_ceiling(bench: Path, threads: int) -> float:
    """The harness's fp32 matmul ceiling (GFLOP/s), measured in a fresh process with the runs' thread count."""
    out = bench / "work" / "matmul_ceiling.json"
    subprocess.run(
        [sys.executable, "matmul_ceiling.py", "--threads", str(threads), "--out", str(out)],
        cwd=bench,
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())["ceiling_gflops"]


def _tune_config(bench: Path, name: str) -> Path:
    text = (bench / "configs" / "torchtune" / f"{name}.yaml").read_text()
    text = text.replace("torchtune.", "tune.")
    text = re.sub(r"_component_: bench_metric_logger\.TimedDiskLogger.*", "_component_: tune.training.DiskLogger", text)
    path = bench / "configs" / "tune" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _run_process(command: list[str], cwd: Path, env: dict, log_path: Path) -> tuple[int, str, float]:
    """Runs ``command``; returns its exit status, output tail and peak RSS in MiB (from wait4, no /usr/bin/time)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read()[-3000:]
    return proc.returncode, tail, usage.ru_maxrss / 1024  # Linux reports kilobytes


def _steps(system: str, out: Path) -> list[tuple[int, float, float]]:
    """(step, timestamp, tokens/s) per logged step."""
    if system == "torchtune":
        records = [json.loads(line) for line in (out / "logs" / "steps.jsonl").read_text().splitlines()]
        return [(r["step"], r["t"], r["tokens_per_second_per_gpu"]) for r in records if r.get("event") == "step"]
    records = [json.loads(line) for line in (out / "logs" / "log.txt").read_text().splitlines()]
    return [(r["step"], r["time"], r["tokens_per_second"]) for r in records if "tokens_per_second" in r]


def _losses(system: str, out: Path) -> tuple[float, float]:
    name = "steps.jsonl" if system == "torchtune" else "log.txt"
    losses = [json.loads(line).get("loss") for line in (out / "logs" / name).read_text().splitlines()]
    losses = [x for x in losses if x is not None]
    return losses[0], losses[-1]


def _throughput(steps: list[tuple[int, float, float]]) -> float:
    # tokens of step i = its tokens/s times its duration (both systems log right after the optimizer step)
    window = steps[WARMUP_STEPS - 1 :]
    tokens = sum(tps * (t - t_prev) for (_, t_prev, _), (_, t, tps) in zip(window, window[1:]))
    return tokens / (window[-1][1] - window[0][1])


def _run(
    system: str, python: str, bench: Path, name: str, steps: int, packed: bool, rep: int, extra: list[str]
) -> dict:
    recipe = RECIPES[name.rsplit("_", 1)[0]][0]
    config = bench / "configs" / "torchtune" / f"{name}.yaml" if system == "torchtune" else _tune_config(bench, name)
    out = Path("work") / "runs" / f"{system}_{name}_{'packed' if packed else 'unpacked'}_{rep}"
    shutil.rmtree(bench / out, ignore_errors=True)
    overrides = [f"output_dir={out}", f"max_steps_per_epoch={steps}", *extra] + (
        ["dataset.packed=True"] if packed else []
    )
    module = "torchtune._cli.tune" if system == "torchtune" else "tune._cli.main"
    paths = [str(ROOT), str(bench / "tt_ext"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(bench / "work" / "hf_home"))
    command = [python, "-m", module, "run", recipe, "--config", str(config), *overrides]
    status, tail, peak_mib = _run_process(command, bench, env, bench / "work" / "logs" / f"{out.name}.log")
    if status != 0:
        print(tail, file=sys.stderr)
        raise SystemExit(f"{system} {name} (packed={packed}) failed with exit status {status}")
    first, last = _losses(system, bench / out)
    return {
        "tokens_per_second": _throughput(_steps(system, bench / out)),
        "peak_rss_mib": peak_mib,
        "loss_first": first,
        "loss_last": last,
    }


def _non_embedding_params(bench: Path, size: str) -> int:
    cfg = json.loads((bench / "work" / "assets" / f"llama-{size}" / "config.json").read_text())
    d, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    # attention, MLP and norms of every layer, the final norm, and the output projection (a matmul per token)
    return layers * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d + d * cfg["vocab_size"]


def _rows(results: dict, bench: Path, ceiling: float) -> list[dict]:
    rows = []
    for (name, size, data, system), runs in results.items():
        tps = statistics.mean(r["tokens_per_second"] for r in runs)
        rows.append(
            {
                "recipe": name,
                "size": size,
                "data": data,
                "system": system,
                "runs": runs,
                "tokens_per_second": tps,
                "peak_rss_mib": statistics.mean(r["peak_rss_mib"] for r in runs),
                "loss_first": runs[0]["loss_first"],
                "loss_last": runs[0]["loss_last"],
                "mfu": RECIPES[name][1] * _non_embedding_params(bench, size) * tps / (ceiling * 1e9),
            }
        )
    return rows


def _add_ratios(rows: list[dict]) -> None:
    peers = {(r["recipe"], r["size"], r["data"]): r for r in rows if r["system"] == "torchtune"}
    for row in rows:
        peer = peers.get((row["recipe"], row["size"], row["data"]))
        if row["system"] != "torchtune" and peer is not None:
            row["ratio"] = {
                "tokens_per_second": row["tokens_per_second"] / peer["tokens_per_second"],
                "peak_rss": row["peak_rss_mib"] / peer["peak_rss_mib"],
            }


def _table(rows: list[dict], ceiling: float, note: str) -> str:
    order = {"small": 0, "medium": 1, "lora_qv": 0, "lora_all": 1, "full": 2, "unpacked": 0, "packed": 1}
    rows = sorted(
        rows, key=lambda r: (order[r["size"]], order[r["recipe"]], order[r["data"]], r["system"] != "tune", r["system"])
    )
    lines = [
        f"fp32 matmul ceiling {ceiling:.1f} GFLOP/s; {note}; tokens/s = mean over reps of non-padding tokens/s "
        f"(steps {WARMUP_STEPS + 1}..N); ratio = this system / torchtune 0.6.1",
        "",
        "| system | recipe | size | data | tokens/s | tok/s ratio | peak RSS MiB | RSS ratio | MFU "
        "| loss first -> last |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row.get("ratio")
        tok_ratio, rss_ratio = ("-", "-")
        if ratio:
            tok_ratio, rss_ratio = f"{ratio['tokens_per_second']:.2f}", f"{ratio['peak_rss']:.2f}"
        lines.append(
            f"| {row['system']} | {row['recipe']} | {row['size']} | {row['data']} | {row['tokens_per_second']:,.0f} "
            f"| {tok_ratio} | {row['peak_rss_mib']:,.0f} | {rss_ratio} | {row['mfu']:.1%} "
            f"| {row['loss_first']:.3f} -> {row['loss_last']:.3f} |"
        )
    return "\n".join(lines)


def _merge(paths: list[Path]) -> None:
    parts = [json.loads(p.read_text()) for p in paths]
    ceiling = max(p["ceiling_gflops"] for p in parts)
    rows = []
    for part in parts:
        for row in part["rows"]:
            row["mfu"] *= part["ceiling_gflops"] / ceiling  # MFU against the common ceiling
            row.pop("ratio", None)
            rows.append(row)
    _add_ratios(rows)
    ceilings = ", ".join(f"{p['ceiling_gflops']:.0f}" for p in parts)
    note = f"merged from {len(parts)} result files (their ceilings {ceilings}; MFU uses the largest)"
    print(_table(rows, ceiling, note))


def _parse_variants(specs: list[str]) -> dict[str, list[str]]:
    variants = {}
    for spec in specs:
        name, _, overrides = spec.partition(":")
        if not name or not overrides:
            raise SystemExit(f"--variant must look like NAME:KEY=VALUE[;KEY=VALUE], got {spec!r}")
        variants[f"tune+{name}"] = overrides.split(";")
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench", help="the peer harness")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "recipes")
    parser.add_argument("--output", type=Path, help="result JSON (default: WORKDIR/bench_recipes.json)")
    parser.add_argument("--torchtune-python", help="python of an environment with torchtune 0.6.1 (harness .venvs/tt)")
    parser.add_argument("--sizes", default="small,medium", help="comma list of small, medium")
    parser.add_argument("--recipes", default="lora_qv,lora_all,full", help="comma list of lora_qv, lora_all, full")
    parser.add_argument("--data", default="unpacked,packed", help="comma list of unpacked, packed")
    parser.add_argument("--steps-small", type=int, default=100, help="optimizer steps per small run (harness: 100)")
    parser.add_argument("--steps-medium", type=int, default=30, help="optimizer steps per medium run (harness: 30)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE[;KEY=VALUE] (unpacked rows)")
    parser.add_argument("--merge", type=Path, nargs="+", help="print one table from these result JSON files")
    args = parser.parse_args()
    if args.merge:
        return _merge(args.merge)
    steps = {"small": args.steps_small, "medium": args.steps_medium}
    if min(steps.values()) <= WARMUP_STEPS + 1:
        parser.error(f"steps must be above {WARMUP_STEPS + 1}: the first {WARMUP_STEPS} steps are warm-up")
    sizes, names, datas = args.sizes.split(","), args.recipes.split(","), args.data.split(",")
    systems = {"tune": (sys.executable, [])}
    systems.update({name: (sys.executable, extra) for name, extra in _parse_variants(args.variant).items()})
    if args.torchtune_python:
        systems["torchtune"] = (args.torchtune_python, [])
    else:
        print("no --torchtune-python: measuring tune only (create the harness's .venvs/tt to compare)", flush=True)
    bench = _prepare(args.harness.resolve(), args.workdir.resolve(), sizes)
    import torch

    threads = torch.get_num_threads()
    ceiling_before = _matmul_ceiling(bench, threads)
    results: dict[tuple, list[dict]] = {}
    for rep in range(args.reps):
        for size in sizes:
            for name in names:
                for data in datas:
                    for system, (python, extra) in systems.items():
                        if extra and data == "packed":
                            continue  # variants change the unpacked batching only
                        print(f"rep {rep + 1}: {system} {name} {size} {data} ...", flush=True)
                        run = _run(system, python, bench, f"{name}_{size}", steps[size], data == "packed", rep, extra)
                        results.setdefault((name, size, data, system), []).append(run)
    ceiling_after = _matmul_ceiling(bench, threads)
    ceiling = max(ceiling_before, ceiling_after)
    rows = _rows(results, bench, ceiling)
    _add_ratios(rows)
    note = (
        f"{threads} torch threads, ceiling before {ceiling_before:.0f} / after {ceiling_after:.0f}; steps small "
        f"{steps['small']}, medium {steps['medium']}; {args.reps} rep(s)"
    )
    table = _table(rows, ceiling, note)
    print(table)
    output = args.output or args.workdir / "bench_recipes.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"ceiling_gflops": ceiling, "note": note, "steps": steps, "rows": rows}, indent=2))
    output.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
