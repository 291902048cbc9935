"""The longest sequence that trains: for a fixed model and memory budget, tune's recipes vs torchtune 0.6.1.

One command (run from the repository root; the peer harness in ../shared/bench is copied into the work dir and its
small Llama and SentencePiece tokenizer are built there on first use; torchtune 0.6.1 comes from the site dir the
tests install, ``~/.cache/tune-tests/torchtune-0.6.1-site``, run with this venv's python)::

    .venv/bin/python benchmarks/bench_long_context.py                     # the 8 one-device rows: ~20 min on 2 cores
    .venv/bin/python benchmarks/bench_long_context.py --configs tune-cp2  # context parallelism over 2 processes

Defaults: ``--budget-gb 1.5`` (GiB per process), ``--max-len 24576``, the harness's ``llama-small`` (``--model``
takes another Hugging Face checkpoint dir of a Llama 2 shape). Each invocation rewrites ``WORKDIR``'s result files.
``--dry`` proves the script runs (lengths 256 and 512 per row, no budget; about a minute for the 8 rows).
``--device cuda`` measures on one GPU (the CP rows: as many GPUs as ranks).

Definition. For each row, the longest L is the largest sequence length such that a training run of batch size 1,
one sample of exactly L tokens per step, full fine-tuning, keeps its peak memory at or below ``--budget-gb`` (GiB).
Each trial is its own process running the real recipe (``tune run full_finetune_single_device`` /
``full_finetune_distributed``, torchtune's ``tune run full_finetune_single_device``) for 2 optimizer steps: the
second step's forward and backward run with AdamW's state allocated, so the peak covers weights, gradients,
optimizer state and activations. Every run ends with the recipes' end-of-epoch checkpoint save (neither recipe can
skip it): for the default ~7M-parameter model that is ~27 MiB of weights written, the same at every L, so it cannot
decide the search. Search: L = 512, 1024, 2048, ... (doubling, ``--max-len`` itself tried last) until a trial is
over budget, then bisection between the last length within budget and the first over it, down to 1/16 of that
bracket (lengths stay multiples of 64, of 2 x ranks x 64 under context parallelism); memory is assumed monotone in
L. A row that never goes over budget reports ``>= max-len``.

Memory. On CPU: the peak resident set size of each process. A ``sitecustomize`` hook put on every trial's
``PYTHONPATH`` writes each Python process's ``VmHWM`` (the kernel's RSS high-water mark, /proc/self/status) when it
exits; a row's peak is the largest over its rank processes (``RANK`` set by torchrun), or over all processes of a
one-device run. ``os.wait4``'s ``ru_maxrss`` of the launched command (the largest RSS in its process tree) is kept
as a cross-check and used if a hook file is missing. On CUDA: ``torch.cuda.max_memory_allocated`` in the recipe
process, from the metric logs (``log_peak_memory_stats=True``: ``peak_memory_alloc``, GiB, largest over the logged
steps; rank 0's under context parallelism); an out-of-memory crash counts as over budget. Peak RSS is not exactly
repeatable: identical trials differed by up to ~300 MiB on the 2-core machine (benchmarks/README.md), so a found L is
good to roughly the length that much memory buys; ``--repeats N`` runs every length N times and uses the median.

Data. ``WORKDIR/data/long_docs.json``: 2 synthetic documents of random words, each more tokens long than
``--max-len`` (checked with the tokenizer), read by each system's ``text_completion_dataset`` with
``tokenizer.max_seq_len = L`` (L + 1 for torchtune, whose text-completion dataset keeps ``max_seq_len - 1``
tokens): both systems cut every document to the same L tokens (BOS and the first L - 1 word pieces, no EOS), and
``padded_collate_sft`` at batch size 1 gives one unpadded row with no mask (causal SDPA). ``model.max_seq_len`` is
set to the same value (RoPE table). Everything else is the harness's ``configs/torchtune/full_small.yaml`` (fp32 on
CPU, bf16 on CUDA; fused AdamW; compile off; shuffle off), with ``torchtune.`` replaced by ``tune.`` for tune.

Rows (``--configs``; AC = activation checkpointing of every transformer layer):

- ``tune``: tune's ``full_finetune_single_device`` with the loss tune's shipped configs use,
  ``tune.modules.loss.LinearCrossEntropyLoss`` (the output projection runs inside the loss, a chunk of tokens at a
  time: full ``[L, vocab]`` logits never exist); no AC.
- ``tune-ac``: ``enable_activation_checkpointing=True``.
- ``tune-ac-offload``: AC and ``enable_activation_offloading=True`` (on CPU tune ignores offloading with a warning:
  there is no other memory to offload to; the row shows that it is the same as ``tune-ac``).
- ``tune-fullce``: no AC, ``loss.num_output_chunks=1``: the projection and cross-entropy of all L tokens at once,
  i.e. full ``[L, vocab]`` fp32 logits, what a plain (unchunked) cross-entropy holds.
- ``torchtune``: torchtune 0.6.1's ``full_finetune_single_device`` with the harness config's loss,
  ``CEWithChunkedOutputLoss`` (8 chunks: the model still returns all L x vocab logits, as 8 tensors, upcast and
  scored a chunk at a time); no AC. The baseline of the ratios.
- ``torchtune-ac``, ``torchtune-ac-offload``: as for tune (torchtune 0.6.1 refuses offloading off CUDA).
- ``torchtune-fullce``: ``loss._component_=torch.nn.CrossEntropyLoss`` on the full logits.
- ``tune-cp2``, ``tune-cp4``: tune's ``full_finetune_distributed`` on 2 / 4 processes (``tune run
  --nproc_per_node N``), ``context_parallel_dim=N``, AC on: each rank holds L/N tokens of the sequence.

Activation memory: the peak at 1k, 2k, 4k and 8k tokens (taken from the doubling phase) minus the same row's peak
at 512 tokens, per rank, and MiB per 1k tokens from the largest of them: linear growth in L shows as a constant
MiB per 1k tokens; under context parallelism it should fall about N-fold.

Prints two markdown tables and writes them with every trial to ``WORKDIR/bench_long_context.{json,md}``.
"""

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SITE = Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests")) / "torchtune-0.6.1-site"
STEPS = 2  # the second step runs with the optimizer state allocated
BASE_LEN = 512
ACTIVATION_LENS = (1024, 2048, 4096, 8192)
RESOLUTION = 16  # bisect until the bracket is this fraction of the doubling bracket
AC = "enable_activation_checkpointing=True"
OFFLOAD = "enable_activation_offloading=True"
RSS_HOOK = """import atexit, json, os, sys

def _dump_vmhwm():
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    path = os.path.join(os.environ["BENCH_RSS_DIR"], f"{os.getpid()}.json")
    with open(path, "w") as out:
        json.dump({"pid": os.getpid(), "rank": os.environ.get("RANK"), "vmhwm_kib": kib, "argv": sys.argv[:2]}, out)

if os.environ.get("BENCH_RSS_DIR"):
    atexit.register(_dump_vmhwm)
"""


@dataclass(frozen=True)
class Row:
    system: str  # tune | torchtune
    overrides: tuple[str, ...] = ()
    ranks: int = 1  # > 1: tune's full_finetune_distributed with context parallelism over the ranks

    @property
    def unit(self) -> int:
        return 64 if self.ranks == 1 else 2 * self.ranks * 64


ROWS = {
    "tune": Row("tune"),
    "tune-ac": Row("tune", (AC,)),
    "tune-ac-offload": Row("tune", (AC, OFFLOAD)),
    "tune-fullce": Row("tune", ("loss.num_output_chunks=1",)),
    "torchtune": Row("torchtune"),
    "torchtune-ac": Row("torchtune", (AC,)),
    "torchtune-ac-offload": Row("torchtune", (AC, OFFLOAD)),
    "torchtune-fullce": Row("torchtune", ("loss._component_=torch.nn.CrossEntropyLoss",)),
    "tune-cp2": Row("tune", (AC, "context_parallel_dim=2"), ranks=2),
    "tune-cp4": Row("tune", (AC, "context_parallel_dim=4"), ranks=4),
}
BASELINE = "torchtune"


@dataclass
class Context:
    bench: Path  # the harness copy, with work/assets
    workdir: Path
    device: str
    budget_mib: float
    max_len: int
    model_dir: Path
    torchtune_python: str
    torchtune_site: Path | None
    repeats: int = 1


# ------------------------------------------------------------------------------------------------------ setup


def _prepare_harness(harness: Path, workdir: Path) -> Path:
    bench = workdir / "bench"
    if not bench.exists():
        shutil.copytree(harness, bench, ignore=shutil.ignore_patterns(".venvs", "work"))
        for path in bench.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
    assets = bench / "work" / "assets"
    if not (assets / "llama-small").is_dir() or not (assets / "tokenizer" / "tokenizer.model").is_file():
        print(f"building the harness assets in {assets} ...", flush=True)
        subprocess.run([sys.executable, "make_assets.py", "--sizes", "small"], cwd=bench, check=True)
    return bench


def _make_dataset(ctx: Context) -> Path:
    """Two documents of random words, each longer in tokens than the longest trial (checked)."""
    import sentencepiece

    path = ctx.workdir / "data" / "long_docs.json"
    sp = sentencepiece.SentencePieceProcessor(
        model_file=str(ctx.bench / "work" / "assets" / "tokenizer" / "tokenizer.model")
    )
    if path.is_file():
        docs = [row["text"] for row in json.loads(path.read_text())]
        if min(len(sp.encode(d)) for d in docs) > ctx.max_len + 2:
            return path
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    docs = [" ".join(rng.choice(words) for _ in range(ctx.max_len + 64)) for _ in range(STEPS)]
    assert min(len(sp.encode(d)) for d in docs) > ctx.max_len + 2, "a document is shorter than --max-len tokens"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"text": d} for d in docs]))
    return path


def _config(ctx: Context, system: str, data: Path) -> Path:
    """The harness's full_small config, with the long documents, batch 1 and the system's names."""
    cfg = yaml.safe_load((ctx.bench / "configs" / "torchtune" / "full_small.yaml").read_text())
    pkg = "torchtune" if system == "torchtune" else "tune"
    assets = ctx.bench / "work" / "assets"
    cfg["model"]["_component_"] = f"{pkg}.models.llama2.llama2"
    cfg["tokenizer"].update(
        _component_=f"{pkg}.models.llama2.llama2_tokenizer", path=str(assets / "tokenizer" / "tokenizer.model")
    )
    cfg["checkpointer"].update(_component_=f"{pkg}.training.FullModelHFCheckpointer", checkpoint_dir=str(ctx.model_dir))
    cfg["dataset"] = {
        "_component_": f"{pkg}.datasets.text_completion_dataset",
        "source": "json",
        "data_files": str(data),
        "column": "text",
        "split": "train",
        "add_eos": True,
    }
    cfg.update(collate_fn=f"{pkg}.data.padded_collate_sft", batch_size=1, shuffle=False, max_steps_per_epoch=STEPS)
    cfg["lr_scheduler"]["_component_"] = f"{pkg}.training.lr_schedulers.get_cosine_schedule_with_warmup"
    cfg["profiler"]["_component_"] = f"{pkg}.training.setup_torch_profiler"
    cfg["loss"] = {"_component_": f"{pkg}.modules.loss.CEWithChunkedOutputLoss"}
    if system == "tune":
        cfg["loss"] = {"_component_": "tune.modules.loss.LinearCrossEntropyLoss"}
        cfg["metric_logger"] = {
            "_component_": "tune.training.DiskLogger",
            "log_dir": "${output_dir}/logs",
            "filename": "log.txt",
        }
    cfg.update(log_peak_memory_stats=True, device=ctx.device, dtype="fp32" if ctx.device == "cpu" else "bf16")
    path = ctx.workdir / "configs" / f"{system}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _distributed_config(single: Path) -> Path:
    cfg = yaml.safe_load(single.read_text())
    cfg.pop("optimizer_in_bwd", None)  # a single-device option
    path = single.with_name("tune_distributed.yaml")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------------ trials


def _command(ctx: Context, row: Row, configs: dict, length: int, out: Path) -> tuple[str, list[str]]:
    cut = length + 1 if row.system == "torchtune" else length  # torchtune 0.6.1 keeps max_seq_len - 1 tokens
    overrides = [f"output_dir={out}", f"tokenizer.max_seq_len={cut}", f"model.max_seq_len={cut}", *row.overrides]
    if row.system == "torchtune":
        command = [
            "-m",
            "torchtune._cli.tune",
            "run",
            "full_finetune_single_device",
            "--config",
            str(configs["torchtune"]),
        ]
        return ctx.torchtune_python, command + overrides
    command = ["-m", "tune._cli.main", "run"]
    if row.ranks > 1:
        command += ["--standalone", "--nproc_per_node", str(row.ranks), "full_finetune_distributed"]
        return sys.executable, command + ["--config", str(configs["tune_distributed"]), *overrides]
    return sys.executable, command + ["full_finetune_single_device", "--config", str(configs["tune"]), *overrides]


def _env(ctx: Context, system: str, rss_dir: Path) -> dict:
    paths = [str(ctx.workdir / "rss_hook"), str(ROOT)]
    if system == "torchtune":
        paths = [
            str(ctx.workdir / "rss_hook"),
            *([str(ctx.torchtune_site)] if ctx.torchtune_site else []),
            str(ctx.bench / "tt_ext"),
        ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TQDM_DISABLE": "1", "BENCH_RSS_DIR": str(rss_dir)}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(ctx.workdir / "hf_home"))
    return env


def _launch(python: str, args: list[str], env: dict, log_path: Path) -> tuple[int, float, float]:
    """Runs the trial; returns its exit status, wall seconds and ``wait4``'s ru_maxrss (MiB) of its process tree."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss / 1024


def _rank_peaks(rss_dir: Path, ranks: int) -> list[float]:
    """Peak RSS (MiB) per rank from the hook's files: the rank processes, or the largest process of a 1-rank run."""
    records = [json.loads(p.read_text()) for p in rss_dir.glob("*.json")]
    ranked = sorted((int(r["rank"]), r["vmhwm_kib"] / 1024) for r in records if r["rank"] is not None)
    if ranks > 1:
        return [mib for _, mib in ranked]
    return [max((r["vmhwm_kib"] / 1024 for r in records), default=0.0)] if records else []


def _gpu_peak(system: str, out: Path) -> float | None:
    """Largest ``peak_memory_alloc`` (GiB -> MiB) the recipe logged."""
    path = out / "logs" / ("steps.jsonl" if system == "torchtune" else "log.txt")
    if not path.is_file():
        return None
    values = [json.loads(line).get("peak_memory_alloc") for line in path.read_text().splitlines() if line.strip()]
    values = [v for v in values if isinstance(v, (int, float))]
    return max(values) * 1024 if values else None


def _notes(log_text: str) -> list[str]:
    """The log's warnings about the options measured here, and its last error line."""
    lines = [line.strip()[:300] for line in log_text.splitlines()]
    warnings = [x for x in lines if "WARNING" in x and ("offload" in x or "checkpointing" in x or "parallel" in x)]
    errors = [x for x in lines if re.match(r"^[\w.]*(Error|Exception)\b", x)]
    return warnings + errors[-1:]


def _trial(ctx: Context, name: str, row: Row, configs: dict, length: int) -> dict:
    out = ctx.workdir / "runs" / f"{name}_{length}"
    shutil.rmtree(out, ignore_errors=True)
    rss_dir = out / "rss"
    rss_dir.mkdir(parents=True)
    python, args = _command(ctx, row, configs, length, out)
    status, seconds, wait4_mib = _launch(python, args, _env(ctx, row.system, rss_dir), out / "trial.log")
    log_text = (out / "trial.log").read_text(errors="replace")
    ranks = _rank_peaks(rss_dir, row.ranks) or [wait4_mib]
    peak = max(ranks) if ctx.device == "cpu" else _gpu_peak(row.system, out)
    oom = ctx.device == "cuda" and "OutOfMemoryError" in log_text
    trial = {
        "length": length,
        "status": status,
        "seconds": round(seconds, 1),
        "peak_mib": peak,
        "rank_peaks_mib": ranks,
    }
    trial.update(wait4_mib=wait4_mib, log=str(out / "trial.log"), notes=_notes(log_text))
    trial["over"] = oom or (status == 0 and peak is not None and peak > ctx.budget_mib)
    trial["failed"] = status != 0 and not oom
    for path in [*out.glob("step_*"), *out.glob("epoch_*")]:  # the end-of-epoch checkpoint: nothing reads it
        shutil.rmtree(path, ignore_errors=True)
    shown = "-" if peak is None else f"{peak:,.0f} MiB"
    verdict = "FAILED" if trial["failed"] else "over" if trial["over"] else "ok"
    print(f"  {name} L={length}: {shown} ({verdict}, {seconds:.0f} s)", flush=True)
    return trial


def _repeated_trial(ctx: Context, name: str, row: Row, configs: dict, length: int) -> dict:
    """``--repeats`` runs of one length; the peak is their median (peak RSS varies from run to run)."""
    trials = [_trial(ctx, name, row, configs, length) for _ in range(ctx.repeats)]
    odd = [t for t in trials if t["status"] != 0 or t["peak_mib"] is None]  # a crash, or an out-of-memory
    if len(trials) == 1 or odd:
        return odd[0] if odd else trials[0]
    peaks = sorted(t["peak_mib"] for t in trials)
    trial = {**trials[0], "peak_mib": statistics.median(peaks), "repeat_peaks_mib": peaks}
    trial.update(seconds=sum(t["seconds"] for t in trials), over=statistics.median(peaks) > ctx.budget_mib)
    return trial


# ------------------------------------------------------------------------------------------------------ search


def _bisect(run, lo: int, hi: int, unit: int) -> tuple[int, int]:
    step = max(unit, (hi - lo) // RESOLUTION // unit * unit)
    while hi - lo > step:
        mid = (lo + hi) // 2 // unit * unit
        if mid in (lo, hi):
            break
        trial = run(mid)
        if trial["failed"]:
            break
        lo, hi = (lo, mid) if trial["over"] else (mid, hi)
    return lo, hi


def _double(run, base: int, top: int) -> tuple[int | None, int | None]:
    """Doubles L from ``base`` (then tries ``top`` itself); returns the last length within budget and the first
    over it (None: none over, or a failed trial)."""
    lo, length = None, base
    while True:
        trial = run(length)
        if trial["failed"] or trial["over"]:
            return lo, None if trial["failed"] else length
        lo = length
        if length >= top:
            return lo, None
        length = min(2 * length, top)


def _search(ctx: Context, name: str, row: Row, configs: dict, base: int) -> dict:
    trials: dict[int, dict] = {}

    def run(length: int) -> dict:
        if length not in trials:
            trials[length] = _repeated_trial(ctx, name, row, configs, length)
        return trials[length]

    lo, hi = _double(run, base, ctx.max_len // row.unit * row.unit)
    if lo is not None and hi is not None:
        lo, hi = _bisect(run, lo, hi, row.unit)
    failed = [t for t in trials.values() if t["failed"]]
    return {
        "row": name,
        "system": row.system,
        "ranks": row.ranks,
        "overrides": list(row.overrides),
        "longest": lo,
        "first_over": hi,
        "capped": lo is not None and hi is None and not failed,
        "failed": failed[0] if failed else None,
        "trials": [trials[k] for k in sorted(trials)],
    }


# ------------------------------------------------------------------------------------------------------ tables


def _peak_at(result: dict, length: int | None) -> float | None:
    return next((t["peak_mib"] for t in result["trials"] if t["length"] == length and not t["failed"]), None)


def _longest_cell(result: dict, max_len: int) -> str:
    if result["failed"] and result["longest"] is None:
        return f"fails at {result['failed']['length']:,}"
    if result["longest"] is None:
        return f"< {result['first_over']:,}"
    return f">= {result['longest']:,} (cap)" if result["capped"] else f"{result['longest']:,}"


def _longest_table(results: list[dict], ctx: Context) -> str:
    base = next((r["longest"] for r in results if r["row"] == BASELINE), None)
    measure = "peak RSS" if ctx.device == "cpu" else "max_memory_allocated"
    lines = [
        f"budget {ctx.budget_mib / 1024:.2f} GiB per process ({measure}), "
        f"max length {ctx.max_len:,}; ratio = longest L / {BASELINE}'s",
        "",
        "| row | ranks | longest L within budget | peak MiB at it | first L over | peak MiB there | vs torchtune "
        "| trials | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r['longest'] / base:.2f}x" if base and r["longest"] else "-"
        peak_ok, peak_over = _peak_at(r, r["longest"]), _peak_at(r, r["first_over"])
        cells = [
            r["row"],
            str(r["ranks"]),
            _longest_cell(r, ctx.max_len),
            "-" if peak_ok is None else f"{peak_ok:,.0f}",
            "-" if r["first_over"] is None else f"{r['first_over']:,}",
            "-" if peak_over is None else f"{peak_over:,.0f}",
            ratio,
            str(len(r["trials"])),
            f"{sum(t['seconds'] for t in r['trials']):.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _activation_table(results: list[dict], base: int, lens: tuple[int, ...]) -> str:
    head = " | ".join(f"+{n:,}" for n in lens)
    lines = [
        f"activation memory per rank: peak MiB at L minus the row's peak at L = {base:,}",
        "",
        f"| row | peak MiB at {base:,} | {head} | MiB per 1k tokens |",
        "|---|---|" + "---|" * len(lens) + "---|",
    ]
    for r in results:
        at_base = _peak_at(r, base)
        deltas = [None if at_base is None or _peak_at(r, n) is None else _peak_at(r, n) - at_base for n in lens]
        known = [(n, d) for n, d in zip(lens, deltas) if d is not None]
        slope = f"{known[-1][1] / (known[-1][0] - base) * 1024:.1f}" if known else "-"
        cells = ["-" if d is None else f"{d:,.0f}" for d in deltas]
        lines.append(
            f"| {r['row']} | {'-' if at_base is None else f'{at_base:,.0f}'} | " + " | ".join(cells) + f" | {slope} |"
        )
    return "\n".join(lines)


def _problems(results: list[dict]) -> str:
    lines = []
    for r in results:
        if r["failed"]:
            failed = r["failed"]
            notes = "; ".join(failed["notes"]) or "(no error line)"
            lines.append(f"- {r['row']}: exit status {failed['status']} at L={failed['length']:,}: {notes}")
            lines.append(f"  (log: {failed['log']})")
        warnings = {n for t in r["trials"] for n in t["notes"] if "WARNING" in n}
        lines += [f"- {r['row']}: {w}" for w in sorted(warnings)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ main


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--budget-gb", type=float, default=1.5, help="GiB per process (per rank)")
    parser.add_argument("--model", type=Path, help="Hugging Face checkpoint dir (default: the harness's llama-small)")
    parser.add_argument(
        "--configs",
        default="tune,tune-ac,tune-ac-offload,tune-fullce,torchtune,torchtune-ac,torchtune-ac-offload,torchtune-fullce",
        help=f"comma list of {', '.join(ROWS)}",
    )
    parser.add_argument("--max-len", type=int, default=24576, help="longest length tried")
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--torchtune-python", default=sys.executable, help="python that runs torchtune 0.6.1")
    parser.add_argument("--torchtune-site", type=Path, default=DEFAULT_SITE, help="put first on torchtune's PYTHONPATH")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "long_context")
    parser.add_argument("--repeats", type=int, default=1, help="runs per length; the peak is their median")
    parser.add_argument("--dry", action="store_true", help="two short lengths per row, no budget: proves it runs")
    parser.add_argument("--base-len", type=int, default=BASE_LEN, help="first length of the doubling (GPU: larger)")
    return parser.parse_args()


def _context(args: argparse.Namespace) -> Context:
    workdir = args.workdir.resolve()
    bench = _prepare_harness(args.harness.resolve(), workdir)
    site = args.torchtune_site if args.torchtune_site and args.torchtune_site.is_dir() else None
    max_len = 2 * 256 if args.dry else args.max_len
    budget = float("inf") if args.dry else args.budget_gb * 1024
    model = (args.model or bench / "work" / "assets" / "llama-small").resolve()
    return Context(bench, workdir, args.device, budget, max_len, model, args.torchtune_python, site, args.repeats)


def main() -> None:
    args = _parse()
    names = args.configs.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; known: {', '.join(ROWS)}")
    ctx = _context(args)
    (ctx.workdir / "rss_hook").mkdir(parents=True, exist_ok=True)
    (ctx.workdir / "rss_hook" / "sitecustomize.py").write_text(RSS_HOOK)
    data = _make_dataset(ctx)
    configs = {"tune": _config(ctx, "tune", data), "torchtune": _config(ctx, "torchtune", data)}
    configs["tune_distributed"] = _distributed_config(configs["tune"])
    base, lens = (256, (512,)) if args.dry else (args.base_len, ACTIVATION_LENS)
    results, text = [], ""
    for name in names:
        print(f"{name}: searching ...", flush=True)
        results.append(_search(ctx, name, ROWS[name], configs, max(base, ROWS[name].unit)))
        text = _write(results, ctx, base, lens)  # after every row: a run cut short keeps the rows it finished
    print(text)
    out = ctx.workdir / "bench_long_context.json"
    print(f"wrote {out}")


def _write(results: list[dict], ctx: Context, base: int, lens: tuple[int, ...]) -> str:
    tables = "\n\n".join([_longest_table(results, ctx), _activation_table(results, base, lens)])
    problems = _problems(results)
    text = tables + (f"\n\nnotes:\n{problems}" if problems else "")
    out = ctx.workdir / "bench_long_context.json"
    meta = {"device": ctx.device, "budget_mib": ctx.budget_mib, "max_len": ctx.max_len, "model": str(ctx.model_dir)}
    out.write_text(json.dumps({**meta, "steps": STEPS, "results": results}, indent=2))
    out.with_suffix(".md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
