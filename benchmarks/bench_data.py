"""Tokenise-and-pack throughput and peak memory: tune vs torchtune 0.6.1 on the same alpaca JSON and tokenizer.

Command (from the repository root; the peer harness is shared/bench, used from a writable copy):

    cp -r ../shared/bench /tmp/bench && python3 -m venv /tmp/bench/.venvs/tt
    /tmp/bench/.venvs/tt/bin/pip install torch==2.13.0
    /tmp/bench/.venvs/tt/bin/pip install -r /tmp/bench/requirements-tt.txt   # torchtune 0.6.1, torchao 0.10.0
    .venv/bin/python /tmp/bench/make_assets.py --sizes ""     # dataset + tokenizer only, into /tmp/bench/work/assets
    .venv/bin/python benchmarks/bench_data.py --assets /tmp/bench/work/assets \\
        --tt-python /tmp/bench/.venvs/tt/bin/python --num-samples 50000 --reps 2

What it does: builds a ``--num-samples`` alpaca-format JSON file by replicating the harness's 2,000 synthetic
samples with a varied instruction (``Variant k``) and a seeded shuffle; then, in separate fresh processes,
interleaved, builds ``alpaca_dataset(tokenizer, source="json", data_files=FILE, packed=True)`` with each
library's Llama-2 SentencePiece tokenizer (``max_seq_len`` 512, no prompt template) and reads every pack once.
Each process starts with an empty Hugging Face datasets cache, so both sides load the JSON and tokenise
everything ("cold"); tune is also run a second time on its own cache ("warm": what a rerun costs).

``--num-proc N`` fixes tune's tokenising processes (default: automatic, 2 on a 2-CPU machine); torchtune has
no such setting (one process).

Reported per run: samples/s = samples / seconds from the builder call until every pack has been read (imports
excluded, timed separately); peak RSS of the process itself and, separately, of its largest child (tune's
tokenising workers); and a SHA-256 over all packs' tokens, equal on both sides when tokenisation and packing
agree token for token. A table is printed and JSON written to ``--out``.
"""

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_data(assets: Path, num_samples: int, out: Path, seed: int = 0) -> Path:
    """Replicates the 2,000 synthetic alpaca samples to ``num_samples``, each copy with a varied instruction."""
    base = json.loads((assets / "alpaca_synth.json").read_text())
    rows = []
    for k in range(-(-num_samples // len(base))):
        for row in base:
            varied = dict(row)
            if k:
                varied["instruction"] = f"{row['instruction']} Variant {k}."
            rows.append(varied)
    rows = rows[:num_samples]
    random.Random(seed).shuffle(rows)
    out.write_text(json.dumps(rows))
    return out


# ---- workers: run in their own process (tune's venv or torchtune's venv) -------------------------------------


def _our_tokenizer(path: str, max_seq_len: int):
    """tune's Llama-2 SentencePiece tokenizer without a prompt template (the alpaca prompt is the template)."""
    try:
        from tune.models.llama2 import llama2_tokenizer
    except ImportError:  # before the family exports it
        from tune.models.llama2._tokenizer import llama2_tokenizer

    return llama2_tokenizer(path, max_seq_len=max_seq_len, prompt_template=None)


def _tokenizer_cost(system: str, tokenizer, data: str, num: int = 2000) -> float:
    """Microseconds per sample of the library's own alpaca transform + ``tokenize_messages``, one process."""
    if system == "torchtune":
        from torchtune.data import AlpacaToMessages
    else:
        from tune.data import AlpacaToMessages
    rows = json.loads(Path(data).read_text())[:num]
    transform = AlpacaToMessages(train_on_input=True)
    start = time.perf_counter()
    for row in rows:
        tokenizer.tokenize_messages(transform(row)["messages"])
    return (time.perf_counter() - start) / len(rows) * 1e6


def _worker(system: str, data: str, tokenizer_path: str, max_seq_len: int, cache_dir: str, num_proc: int) -> dict:
    import hashlib

    t0 = time.perf_counter()
    if system == "torchtune":
        from torchtune.datasets import alpaca_dataset
        from torchtune.models.llama2 import llama2_tokenizer

        tokenizer = llama2_tokenizer(tokenizer_path, max_seq_len=max_seq_len, prompt_template=None)
    else:
        sys.path.insert(0, str(REPO))
        import datasets  # noqa: F401  (tune imports it lazily; torchtune at import: count it as import time on both)
        import pyarrow  # noqa: F401

        from tune.datasets import alpaca_dataset

        tokenizer = _our_tokenizer(tokenizer_path, max_seq_len)
    t1 = time.perf_counter()
    kwargs = {"num_proc": num_proc} if system == "tune" and num_proc else {}
    ds = alpaca_dataset(tokenizer, source="json", data_files=data, packed=True, split="train", cache_dir=cache_dir,
                        **kwargs)  # fmt: skip
    digest = hashlib.sha256()
    num_tokens = 0
    for i in range(len(ds)):  # read every pack once: both sides then have done all the work
        pack = ds[i]
        digest.update(pack["tokens"].long().numpy().tobytes())
        num_tokens += int((pack["labels"] != -100).sum())
    t2 = time.perf_counter()
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokenizer_us = _tokenizer_cost(system, tokenizer, data)
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "system": system, "import_s": t1 - t0, "build_s": t2 - t1, "num_packs": len(ds),
        "trained_tokens": num_tokens, "tokens_sha256": digest.hexdigest()[:16],
        "peak_rss_mib": self_rss, "peak_child_rss_mib": child_rss, "tokenizer_us_per_sample": tokenizer_us,
    }  # fmt: skip


# ---- driver -------------------------------------------------------------------------------------------------------


def _run(python: str, system: str, args, data: Path, cache_dir: str) -> dict:
    cmd = [python, __file__, "--worker", system, "--data", str(data), "--tokenizer", str(args.tokenizer),
           "--max-seq-len", str(args.max_seq_len), "--cache-dir", cache_dir,
           "--num-proc", str(args.num_proc)]  # fmt: skip
    env = dict(os.environ, TQDM_DISABLE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1", TUNE_LOG_LEVEL="WARNING")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO))
    if proc.returncode:
        raise RuntimeError(f"{system} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(results: list[dict], num_samples: int) -> str:
    columns = ["run", "samples/s", "build s", "import s", "packs", "peak RSS MiB", "largest child RSS MiB",
               "tokenizer us/sample", "tokens sha256"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    by_label: dict[str, list[dict]] = {}
    for r in results:
        by_label.setdefault(r["label"], []).append(r)
    summary = {}
    for label, runs in by_label.items():
        build = statistics.median(r["build_s"] for r in runs)
        rss = max(r["peak_rss_mib"] for r in runs)
        child = max(r["peak_child_rss_mib"] for r in runs)
        summary[label] = (num_samples / build, rss)
        rows.append(
            f"| {label} (n={len(runs)}) | {num_samples / build:,.0f} | {build:.2f} | "
            f"{statistics.median(r['import_s'] for r in runs):.2f} | {runs[0]['num_packs']:,} | {rss:,.0f} | "
            f"{child:,.0f} | {statistics.median(r['tokenizer_us_per_sample'] for r in runs):.0f} | "
            f"{runs[0]['tokens_sha256']} |"
        )
    if "torchtune 0.6.1 (cold)" in summary:
        base_speed, base_rss = summary["torchtune 0.6.1 (cold)"]
        for label, (speed, rss) in summary.items():
            if label.startswith("tune"):
                ratio = f"{speed / base_speed:.1f}x torchtune's samples/s, peak RSS {rss / base_rss:.2f}x"
                rows.append(f"\n{label}: {ratio}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", type=Path, help="harness assets folder (alpaca_synth.json, tokenizer/)")
    ap.add_argument("--tt-python", help="python of the torchtune 0.6.1 venv; omit to run tune only")
    ap.add_argument("--num-samples", type=int, default=50_000)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--num-proc", type=int, default=0, help="tune's tokenising processes (0: automatic)")
    ap.add_argument("--out", type=Path, default=Path("bench_data.json"))
    ap.add_argument("--worker", choices=["tune", "torchtune"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        result = _worker(args.worker, args.data, args.tokenizer, args.max_seq_len, args.cache_dir, args.num_proc)
        print(json.dumps(result))
        return

    work = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        data = make_data(args.assets, args.num_samples, work / f"alpaca_{args.num_samples}.json")
        args.tokenizer = args.assets / "tokenizer" / "tokenizer.model"
        results = []
        for rep in range(args.reps):
            plan = [("tune", sys.executable)] + ([("torchtune", args.tt_python)] if args.tt_python else [])
            for system, python in plan if rep % 2 == 0 else plan[::-1]:  # interleave, alternating who goes first
                cache = str(work / f"cache_{system}_{rep}")
                procs = f", {args.num_proc} process{'es' * (args.num_proc > 1)}" if args.num_proc else ""
                label = f"tune (cold{procs})" if system == "tune" else "torchtune 0.6.1 (cold)"
                results.append({"label": label, **_run(python, system, args, data, cache)})
                print(json.dumps(results[-1]), flush=True)
                if system == "tune":  # same cache again: the rerun reads the tokenised data from disk
                    results.append({"label": f"tune (warm cache{procs})", **_run(python, system, args, data, cache)})
                    print(json.dumps(results[-1]), flush=True)
                shutil.rmtree(cache, ignore_errors=True)
        table = _table(results, args.num_samples)
        print(f"\n{args.num_samples:,} alpaca samples, max_seq_len {args.max_seq_len}, {os.cpu_count()} CPUs\n")
        print(table)
        args.out.write_text(json.dumps({"num_samples": args.num_samples, "results": results, "table": table}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
