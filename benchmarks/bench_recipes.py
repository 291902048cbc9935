"""Fine-tuning throughput and peak memory of tune's single-device recipes, side by side with torchtune 0.6.1.

    .venv/bin/python benchmarks/bench_recipes.py --harness ../shared/bench                     # tune only
    .venv/bin/python benchmarks/bench_recipes.py --harness ../shared/bench \\
        --torchtune-python /path/to/bench/.venvs/tt/bin/python --reps 3 --sizes small,medium      # both systems
    .venv/bin/python benchmarks/bench_recipes.py --harness ../shared/bench --steps 10 --recipes lora_qv   # quick

Uses the peer benchmark harness's assets and its torchtune configs (``configs/torchtune/*.yaml``): torchtune runs
them as they are (with the harness's timing logger); tune runs the same files with ``torchtune.`` replaced by
``tune.`` and the metric logger swapped for ``tune.training.DiskLogger``, nothing else changed. Every run is
its own process under ``/usr/bin/time -v`` (peak RSS); runs are interleaved (rep -> size -> recipe -> packing
-> system) so the machine's speed drifts hit both systems alike. ``packed`` rows add ``dataset.packed=True``.

The harness is copied into ``--workdir`` (its folder may be read-only) and its assets are built there once with
its own ``make_assets.py``. A torchtune environment is the harness's ``.venvs/tt`` (``bash setup_venvs.sh``).

tokens/s: non-padding tokens of steps 4..N over their wall time, from each system's per-step log (timestamp and
its own tokens/s, so tokens of step i = tokens/s_i x (t_i - t_{i-1})). MFU = k * N * tokens/s / ceiling, k = 6
for full fine-tuning and 4 for LoRA, N = non-embedding parameters, ceiling = the fp32 ``torch.mm`` rate measured
here (the best, over probes before every run, of the median of 2048x768 @ 768x2048 products). Prints a markdown
table and writes JSON next to the runs.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {  # harness recipe name -> (our recipe, FLOPs per parameter per token)
    "lora_qv": ("lora_finetune_single_device", 4),
    "lora_all": ("lora_finetune_single_device", 4),
    "full": ("full_finetune_single_device", 6),
}
WARMUP_STEPS = 3


def _matmul_ceiling_gflops() -> float:
    import torch

    a, b = torch.randn(2048, 768), torch.randn(768, 2048)
    for _ in range(10):
        torch.mm(a, b)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * 2048 * 768 * 2048 / statistics.median(times) / 1e9


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


def _tune_config(bench: Path, name: str) -> Path:
    text = (bench / "configs" / "torchtune" / f"{name}.yaml").read_text()
    text = text.replace("torchtune.", "tune.")
    text = re.sub(r"_component_: bench_metric_logger\.TimedDiskLogger.*", "_component_: tune.training.DiskLogger", text)
    path = bench / "configs" / "tune" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _command(system: str, python: str, recipe: str, config: Path, out: str, steps: int, packed: bool) -> list[str]:
    overrides = [f"output_dir={out}", f"max_steps_per_epoch={steps}"] + (["dataset.packed=True"] if packed else [])
    module = "tune._cli.main" if system == "tune" else "torchtune._cli.tune"
    return ["/usr/bin/time", "-v", python, "-m", module, "run", recipe, "--config", str(config), *overrides]


def _steps(system: str, out: Path) -> list[tuple[int, float, float]]:
    """(step, timestamp, tokens/s) per logged step."""
    if system == "tune":
        records = [json.loads(line) for line in (out / "logs" / "log.txt").read_text().splitlines()]
        return [(r["step"], r["time"], r["tokens_per_second"]) for r in records if "tokens_per_second" in r]
    records = [json.loads(line) for line in (out / "logs" / "steps.jsonl").read_text().splitlines()]
    return [(r["step"], r["t"], r["tokens_per_second_per_gpu"]) for r in records if r.get("event") == "step"]


def _losses(system: str, out: Path) -> tuple[float, float]:
    if system == "tune":
        losses = [json.loads(line).get("loss") for line in (out / "logs" / "log.txt").read_text().splitlines()]
    else:
        losses = [json.loads(line).get("loss") for line in (out / "logs" / "steps.jsonl").read_text().splitlines()]
    losses = [x for x in losses if x is not None]
    return losses[0], losses[-1]


def _throughput(steps: list[tuple[int, float, float]]) -> float:
    # tokens of step i = its tokens/s times its duration (both systems log right after the optimizer step)
    window = steps[WARMUP_STEPS - 1 :]
    tokens = sum(tps * (t - t_prev) for (_, t_prev, _), (_, t, tps) in zip(window, window[1:]))
    return tokens / (window[-1][1] - window[0][1])


def _run(system: str, python: str, bench: Path, name: str, steps: int, packed: bool, rep: int) -> dict:
    recipe = RECIPES[name.rsplit("_", 1)[0]][0]
    config = bench / "configs" / "torchtune" / f"{name}.yaml" if system == "torchtune" else _tune_config(bench, name)
    out = Path("work") / "runs" / f"{system}_{name}_{'packed' if packed else 'padded'}_{rep}"
    shutil.rmtree(bench / out, ignore_errors=True)
    paths = [str(ROOT), str(bench / "tt_ext"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(bench / "work" / "hf_home"))
    proc = subprocess.run(
        _command(system, python, recipe, config, str(out), steps, packed), cwd=bench, env=env, capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{system} {name} (packed={packed}) failed with exit status {proc.returncode}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    first, last = _losses(system, bench / out)
    return {"tokens_per_second": _throughput(_steps(system, bench / out)), "peak_rss_mib": peak_kb / 1024,
            "loss_first": first, "loss_last": last}


def _non_embedding_params(bench: Path, size: str) -> int:
    cfg = json.loads((bench / "work" / "assets" / f"llama-{size}" / "config.json").read_text())
    d, f, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    # attention, MLP and norms of every layer, the final norm, and the output projection (a matmul per token)
    return layers * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d + d * cfg["vocab_size"]


def _table(rows: list[dict], ceiling: float) -> str:
    lines = [
        f"fp32 matmul ceiling {ceiling:.1f} GFLOP/s; tokens/s = mean over reps (non-padding, steps "
        f"{WARMUP_STEPS + 1}..N); ratio = tune / torchtune",
        "",
        "| recipe | size | data | system | tokens/s | peak RSS MiB | loss first -> last | MFU | tok/s ratio "
        "| RSS ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row.get("ratio")
        ratios = f"{ratio['tokens_per_second']:.2f} | {ratio['peak_rss']:.2f}" if ratio else "- | -"
        lines.append(
            f"| {row['recipe']} | {row['size']} | {row['data']} | {row['system']} | {row['tokens_per_second']:,.0f} "
            f"| {row['peak_rss_mib']:,.0f} | {row['loss_first']:.3f} -> {row['loss_last']:.3f} | {row['mfu']:.1%} "
            f"| {ratios} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench", help="the peer harness")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "recipes")
    parser.add_argument("--torchtune-python", help="python of an environment with torchtune 0.6.1 (harness .venvs/tt)")
    parser.add_argument("--sizes", default="small", help="comma list of small, medium")
    parser.add_argument("--recipes", default="lora_qv,lora_all,full", help="comma list of lora_qv, lora_all, full")
    parser.add_argument("--data", default="padded,packed", help="comma list of padded, packed")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (the first 3 are warm-up)")
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS + 1:
        parser.error(f"--steps must be above {WARMUP_STEPS + 1}: the first {WARMUP_STEPS} steps are warm-up")
    sizes, names, datas = args.sizes.split(","), args.recipes.split(","), args.data.split(",")
    systems = {"tune": sys.executable}
    if args.torchtune_python:
        systems["torchtune"] = args.torchtune_python
    else:
        print("no --torchtune-python: measuring tune only (create the harness's .venvs/tt to compare)", flush=True)
    bench = _prepare(args.harness.resolve(), args.workdir.resolve(), sizes)
    ceiling = _matmul_ceiling_gflops()  # re-probed before every run: the best one is the machine's ceiling
    results: dict[tuple, list[dict]] = {}
    for rep in range(args.reps):
        for size in sizes:
            for name in names:
                for data in datas:
                    for system, python in systems.items():
                        print(f"rep {rep + 1}: {system} {name} {size} {data} ...", flush=True)
                        ceiling = max(ceiling, _matmul_ceiling_gflops())
                        run = _run(system, python, bench, f"{name}_{size}", args.steps, data == "packed", rep)
                        results.setdefault((name, size, data, system), []).append(run)
    rows = []
    for (name, size, data, system), runs in results.items():
        tps = statistics.mean(r["tokens_per_second"] for r in runs)
        row = {"recipe": name, "size": size, "data": data, "system": system, "runs": runs, "tokens_per_second": tps,
               "peak_rss_mib": statistics.mean(r["peak_rss_mib"] for r in runs),
               "loss_first": runs[0]["loss_first"], "loss_last": runs[0]["loss_last"],
               "mfu": RECIPES[name][1] * _non_embedding_params(bench, size) * tps / (ceiling * 1e9)}
        rows.append(row)
    by_key = {(r["recipe"], r["size"], r["data"], r["system"]): r for r in rows}
    for row in rows:
        peer = by_key.get((row["recipe"], row["size"], row["data"], "torchtune"))
        if row["system"] == "tune" and peer is not None:
            row["ratio"] = {"tokens_per_second": row["tokens_per_second"] / peer["tokens_per_second"],
                            "peak_rss": row["peak_rss_mib"] / peer["peak_rss_mib"]}
    table = _table(rows, ceiling)
    print(table)
    output = args.workdir / "bench_recipes.json"
    output.write_text(json.dumps({"ceiling_gflops": ceiling, "steps": args.steps, "rows": rows}, indent=2))
    (args.workdir / "bench_recipes.md").write_text(table + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
