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

``--families llama2,llama3,...`` (or ``all``) instead builds each family's tokenizer with the defaults the shipped
configs use (configs/<family>/*.yaml: the family's builder, its default prompt template or chat format) against
torchtune 0.6.1's builder for that family with its default template; torchtune 0.6.1 has no Qwen 3, so ``qwen3``
is compared with its ``qwen2_5_tokenizer``. Tokenizers of each family's kind, built in code before timing, 8,000
entries each (the harness's Llama-2 model's size; the synthetic corpus supports no more): llama2, mistral, phi3
use the harness's Llama-2-style SentencePiece BPE (phi3 adds its 11 chat tokens); gemma2 a SentencePiece BPE
trained here with Gemma's settings (no dummy prefix, ``<start_of_turn>``/``<end_of_turn>`` as user pieces);
llama3 a tiktoken file from a byte-level BPE trained here with Llama 3's regex (special tokens after the ranks for
tune, at 128000 for torchtune); qwen2_5/qwen3 a byte-level BPE ``tokenizer.json`` with Qwen's NFC, regex and added
tokens (tune) and its ``vocab.json``/``merges.txt`` (torchtune). Token hashes differ between the systems where
their layouts differ (special-token ids, the templates' details, tune's untrained headers).

``--num-proc N`` fixes tune's tokenising processes (default: automatic, 2 on a 2-CPU machine); torchtune has
no such setting (one process).

Reported per run: samples/s = samples / seconds from the builder call until every pack has been read once
(imports excluded, timed separately; the token hash below is computed in a second, untimed pass over the packs);
peak RSS of the process itself and, separately, of its largest child (tune's tokenising workers); the peak
proportional set size (PSS) of the whole process tree, sampled every 100 ms by the driver (what the run costs the
machine: pages a forked worker shares with its parent count once); and a SHA-256 over all packs' tokens, equal on
both sides when tokenisation and packing agree token for token. A table is printed and JSON written to ``--out``.
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


def _our_tokenizer(path: str, max_seq_len: int, family: str = "plain"):
    """tune's tokenizer for ``family`` with the defaults the shipped configs use (configs/<family>/*.yaml);
    ``plain``: the Llama-2 SentencePiece tokenizer without a prompt template (the alpaca prompt is the template)."""
    import importlib

    if family == "plain":
        from tune.models.llama2 import llama2_tokenizer

        return llama2_tokenizer(path, max_seq_len=max_seq_len, prompt_template=None)
    module, builder = _FAMILIES[family][0].rsplit(".", 1)
    return getattr(importlib.import_module(module), builder)(path, max_seq_len=max_seq_len)


def _their_tokenizer(path: str, max_seq_len: int, family: str = "plain"):
    """torchtune 0.6.1's equivalent builder with its default template (qwen3: its qwen2_5 builder, the closest)."""
    import importlib

    if family == "plain":
        from torchtune.models.llama2 import llama2_tokenizer

        return llama2_tokenizer(path, max_seq_len=max_seq_len, prompt_template=None)
    module, builder = _FAMILIES[family][1].rsplit(".", 1)
    if family.startswith("qwen"):  # torchtune's Qwen tokenizer reads vocab.json + merges.txt
        return getattr(importlib.import_module(module), builder)(
            str(Path(path) / "vocab.json"), str(Path(path) / "merges.txt"), max_seq_len=max_seq_len
        )
    return getattr(importlib.import_module(module), builder)(path, max_seq_len=max_seq_len)


# family -> (tune's builder, torchtune 0.6.1's builder, tokenizer kind built by _make_tokenizer)
_FAMILIES = {
    "llama2": ("tune.models.llama2.llama2_tokenizer", "torchtune.models.llama2.llama2_tokenizer", "harness"),
    "llama3": ("tune.models.llama3.llama3_tokenizer", "torchtune.models.llama3.llama3_tokenizer", "tiktoken"),
    "mistral": ("tune.models.mistral.mistral_tokenizer", "torchtune.models.mistral.mistral_tokenizer", "harness"),
    "phi3": ("tune.models.phi3.phi3_mini_tokenizer", "torchtune.models.phi3.phi3_mini_tokenizer", "harness"),
    "gemma2": ("tune.models.gemma2.gemma2_tokenizer", "torchtune.models.gemma.gemma_tokenizer", "gemma"),
    "qwen2_5": ("tune.models.qwen2_5.qwen2_5_tokenizer", "torchtune.models.qwen2_5.qwen2_5_tokenizer", "qwen2_5"),
    "qwen3": ("tune.models.qwen3.qwen3_tokenizer", "torchtune.models.qwen2_5.qwen2_5_tokenizer", "qwen3"),
}
_VOCAB_SIZE = 8000  # the harness's Llama-2 SentencePiece model has 8,000 pieces; the others are trained to match


def _corpus(data: Path) -> list[str]:
    rows = json.loads(data.read_text())
    return [text for row in rows for text in (row["instruction"], row["input"], row["output"]) if text]


def _byte_level_bpe(corpus: list[str], pattern: str, nfc: bool):
    """A byte-level BPE (``tokenizers``) with a family's pre-tokenisation regex, trained to ``_VOCAB_SIZE``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def _make_tokenizer(kind: str, assets: Path, data: Path, out: Path) -> str:
    """The tokenizer file (or folder) for one kind, built in code from the benchmark's own text."""
    import base64

    if kind == "harness":  # Llama-2-style SentencePiece BPE (byte fallback), as Llama 2, Mistral and Phi-3 ship
        return str(assets / "tokenizer" / "tokenizer.model")
    out.mkdir(parents=True, exist_ok=True)
    if kind == "gemma":  # SentencePiece BPE set up like Gemma's: no dummy prefix, turn markers as user pieces
        import sentencepiece as spm

        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(_corpus(data)[:200_000]), model_prefix=str(out / "tokenizer"),
            vocab_size=_VOCAB_SIZE, model_type="bpe", byte_fallback=True, add_dummy_prefix=False,
            remove_extra_whitespaces=False, normalization_rule_name="identity", split_digits=True,
            user_defined_symbols=["<start_of_turn>", "<end_of_turn>"], pad_id=0, eos_id=1, bos_id=2, unk_id=3,
            bos_piece="<bos>", eos_piece="<eos>", pad_piece="<pad>", minloglevel=2, num_threads=2,
        )  # fmt: skip
        return str(out / "tokenizer.model")
    if kind == "tiktoken":  # Llama 3's tokenizer.model: base64 token + rank, 256 bytes first, then the merges
        from tune.models.llama3._tokenizer import LLAMA3_PATTERN

        tokenizer = _byte_level_bpe(_corpus(data), LLAMA3_PATTERN, nfc=False)
        tokenizer.model.save(str(out))
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        unicode_to_byte, extra = {}, 0
        for b in range(256):  # inverse of the byte-level alphabet
            unicode_to_byte[chr(b) if b in printable else chr(256 + extra)] = b
            extra += b not in printable
        ranks = {bytes([b]): b for b in range(256)}
        for line in (out / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]:
            left, right = line.split(" ")
            ranks.setdefault(bytes(unicode_to_byte[c] for c in left + right), len(ranks))
        (out / "tokenizer.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
        return str(out / "tokenizer.model")
    # Qwen: byte-level BPE tokenizer.json with Qwen's NFC + regex and added tokens, plus vocab.json/merges.txt
    from tokenizers import AddedToken

    from tune.models.qwen2_5._tokenizer import QWEN2_5_ADDED_TOKENS, QWEN2_PATTERN
    from tune.models.qwen3._tokenizer import QWEN3_ADDED_TOKENS

    tokenizer = _byte_level_bpe(_corpus(data), QWEN2_PATTERN, nfc=True)
    tokenizer.model.save(str(out))
    for content, special in QWEN3_ADDED_TOKENS if kind == "qwen3" else QWEN2_5_ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return str(out)


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


def _worker(
    system: str, data: str, tokenizer_path: str, max_seq_len: int, cache_dir: str, num_proc: int, family: str
) -> dict:
    import hashlib

    t0 = time.perf_counter()
    if system == "torchtune":
        from torchtune.datasets import alpaca_dataset

        tokenizer = _their_tokenizer(tokenizer_path, max_seq_len, family)
    else:
        sys.path.insert(0, str(REPO))
        import datasets  # noqa: F401  (tune imports it lazily; torchtune at import: count it as import time on both)
        import pyarrow  # noqa: F401

        from tune.datasets import alpaca_dataset

        tokenizer = _our_tokenizer(tokenizer_path, max_seq_len, family)
    t1 = time.perf_counter()
    kwargs = {"num_proc": num_proc} if system == "tune" and num_proc else {}
    ds = alpaca_dataset(tokenizer, source="json", data_files=data, packed=True, split="train", cache_dir=cache_dir,
                        **kwargs)  # fmt: skip
    for i in range(len(ds)):  # read every pack once, as a data loader would: both sides then have done all the work
        ds[i]
    t2 = time.perf_counter()
    digest = hashlib.sha256()  # the check that both sides agree, outside the timing
    num_tokens = 0
    for i in range(len(ds)):
        pack = ds[i]
        digest.update(pack["tokens"].long().numpy().tobytes())
        num_tokens += int((pack["labels"] != -100).sum())
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokenizer_us = _tokenizer_cost(system, tokenizer, data)
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "system": system, "import_s": t1 - t0, "build_s": t2 - t1, "num_packs": len(ds),
        "trained_tokens": num_tokens, "tokens_sha256": digest.hexdigest()[:16],
        "peak_rss_mib": self_rss, "peak_child_rss_mib": child_rss, "tokenizer_us_per_sample": tokenizer_us,
    }  # fmt: skip


# ---- driver -------------------------------------------------------------------------------------------------------


def _tree_pss_kib(root: int) -> int:
    """Proportional set size of ``root`` and all its descendants, in KiB (pages shared between them, such as the
    libraries a forked worker shares with its parent, count once in total, split between the sharers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


def _run(python: str, system: str, args, data: Path, cache_dir: str) -> dict:
    cmd = [python, __file__, "--worker", system, "--data", str(data), "--tokenizer", str(args.tokenizer),
           "--max-seq-len", str(args.max_seq_len), "--cache-dir", cache_dir,
           "--num-proc", str(args.num_proc), "--family", args.family]  # fmt: skip
    env = dict(os.environ, TQDM_DISABLE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1", TUNE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    peak = [0]

    def sample() -> None:  # the whole process tree's memory, every 100 ms, until the worker exits
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_pss_kib(proc.pid))
            time.sleep(0.1)

    import threading

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{system} worker failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_tree_pss_mib"] = peak[0] / 1024
    return result


def _table(results: list[dict], num_samples: int) -> str:
    columns = ["run", "samples/s", "build s", "import s", "packs", "peak RSS MiB", "largest child RSS MiB",
               "peak PSS of all processes MiB", "tokenizer us/sample", "tokens sha256"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    by_label: dict[str, list[dict]] = {}
    for r in results:
        by_label.setdefault(r["label"], []).append(r)
    summary = {}
    for label, runs in by_label.items():
        build = statistics.median(r["build_s"] for r in runs)
        rss = max(r["peak_rss_mib"] for r in runs)
        child = max(r["peak_child_rss_mib"] for r in runs)
        pss = max(r.get("peak_tree_pss_mib", 0.0) for r in runs)
        summary[label] = (num_samples / build, rss, pss)
        rows.append(
            f"| {label} (n={len(runs)}) | {num_samples / build:,.0f} | {build:.2f} | "
            f"{statistics.median(r['import_s'] for r in runs):.2f} | {runs[0]['num_packs']:,} | {rss:,.0f} | "
            f"{child:,.0f} | {pss:,.0f} | {statistics.median(r['tokenizer_us_per_sample'] for r in runs):.0f} | "
            f"{runs[0]['tokens_sha256']} |"
        )
    for label, (speed, rss, pss) in summary.items():
        family, _, system = label.rpartition(": ")
        base = summary.get(f"{family}: torchtune 0.6.1 (cold)" if family else "torchtune 0.6.1 (cold)")
        if system.startswith("tune") and base is not None:
            ratio = f"{speed / base[0]:.1f}x torchtune's samples/s, peak RSS {rss / base[1]:.2f}x"
            if pss and base[2]:
                ratio += f", peak PSS of all its processes {pss / base[2]:.2f}x"
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
    ap.add_argument(
        "--families", default="",
        help=f"comma-separated families ({', '.join(_FAMILIES)}, or 'all'), each with its tokenizer builder's "
        "default settings; empty: the Llama-2 tokenizer without a prompt template",
    )  # fmt: skip
    ap.add_argument("--family", default="plain", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["tune", "torchtune"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        result = _worker(
            args.worker, args.data, args.tokenizer, args.max_seq_len, args.cache_dir, args.num_proc, args.family
        )
        print(json.dumps(result))
        return

    work = Path(tempfile.mkdtemp(prefix="bench_data_"))
    try:
        data = make_data(args.assets, args.num_samples, work / f"alpaca_{args.num_samples}.json")
        families = list(_FAMILIES) if args.families == "all" else [f for f in args.families.split(",") if f]
        unknown = sorted(set(families) - set(_FAMILIES))
        if unknown:
            raise SystemExit(f"unknown families {unknown}; choose from {', '.join(_FAMILIES)} or 'all'")
        tokenizers = {"plain": args.assets / "tokenizer" / "tokenizer.model"} if not families else {}
        for family in families:  # built once, before any timing (from the first 2,000 samples' text)
            kind = _FAMILIES[family][2]
            tokenizers[family] = _make_tokenizer(kind, args.assets, args.assets / "alpaca_synth.json", work / kind)
        results = []
        for rep in range(args.reps):
            for family, tokenizer in tokenizers.items():
                args.family, args.tokenizer = family, tokenizer
                prefix = "" if family == "plain" else f"{family}: "
                plan = [("tune", sys.executable)] + ([("torchtune", args.tt_python)] if args.tt_python else [])
                for system, python in plan if rep % 2 == 0 else plan[::-1]:  # interleave, alternating who goes first
                    cache = str(work / f"cache_{system}_{family}_{rep}")
                    procs = f", {args.num_proc} process{'es' * (args.num_proc > 1)}" if args.num_proc else ""
                    label = prefix + (f"tune (cold{procs})" if system == "tune" else "torchtune 0.6.1 (cold)")
                    results.append({"label": label, "family": family, **_run(python, system, args, data, cache)})
                    print(json.dumps(results[-1]), flush=True)
                    if system == "tune":  # same cache again: the rerun reads the tokenised data from disk
                        label = f"{prefix}tune (warm cache{procs})"
                        results.append({"label": label, "family": family, **_run(python, system, args, data, cache)})
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
