"""`tune estimate` against the measured peak memory of real CPU runs.

Each case writes a randomly initialised model of one family (Llama 3.2, Qwen2.5, Gemma shapes, built with the
family's component builder and saved in tune's own checkpoint format), a packed alpaca dataset (every batch is
exactly ``batch_size x max_seq_len`` tokens, the shape the estimate assumes) and a config, then runs
``tune run`` in a fresh process for a few steps and reads its peak resident set size (``VmHWM``, which the process
writes at exit; ``wait4``'s maximum would also count this process's memory at the fork). The estimate
is :func:`tune._cli._estimate.estimate_config` on the same config (what ``tune estimate`` prints), baseline
included. Prints a Markdown table (estimate, measured, error) and writes JSON with ``--output``::

    .venv/bin/python benchmarks/bench_estimate.py                 # every case, one at a time (a few minutes)
    .venv/bin/python benchmarks/bench_estimate.py --cases tiny    # the cases whose name contains "tiny"
    .venv/bin/python benchmarks/bench_estimate.py --baseline      # the process baseline (no model to speak of)

``--baseline`` runs the smallest model for one step of one 32-token sequence, whose other terms are a few MiB:
the measured peak minus those terms is ``tune.training.CPU_PROCESS_BASELINE_BYTES``. The CPU cases also fix
``tune.training.CPU_ALLOCATOR_OVERHEAD``: what their peak RSS holds beyond every other term, as a share of what
their layers would save without activation checkpointing. ``--device cuda`` runs the GPU cases (Llama 3.2 1B
shapes, bf16) and compares ``torch.cuda.max_memory_allocated`` with the estimate without a baseline.
tests/tune/_cli/test_estimate.py runs the three ``tiny-*`` cases in the default tier and the others in the slow one.
"""

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOKENIZER_VOCAB = 320  # the SentencePiece tokenizer's ids; the models' vocabularies are larger (unused rows)
_WORDS = (
    "the a one two three four five six seven eight nine ten add sum of and is what plus minus times number answer "
    "question write list color red blue green below input response instruction task describes that request"
).split()

# family -> (full builder, LoRA builder, its dimension arguments beyond the shared ones)
FAMILIES = {
    "llama3_2": ("tune.models.llama3_2.llama3_2", "tune.models.llama3_2.lora_llama3_2", {}),
    "qwen2_5": ("tune.models.qwen2_5.qwen2", "tune.models.qwen2_5.lora_qwen2", {"tie_word_embeddings": True}),
    "gemma": ("tune.models.gemma.gemma", "tune.models.gemma.lora_gemma", {"head_dim": None}),
}


@dataclass(frozen=True)
class Case:
    """One calibration run."""

    name: str
    family: str
    method: str  # full, lora, qlora
    embed_dim: int
    num_layers: int
    vocab_size: int
    batch_size: int
    seq_len: int
    activation_checkpointing: bool = False
    num_heads: int = 8
    num_kv_heads: int = 4
    steps: int = 3
    extra: tuple[tuple[str, object], ...] = field(default=())  # top-level config keys to set


CASES = [
    # the three the test suite runs (small and quick: 2 steps, the second one holds the optimizer state)
    Case("tiny-llama-full", "llama3_2", "full", 384, 2, 32000, 1, 64, steps=2),
    Case("tiny-qwen-lora-act", "qwen2_5", "lora", 256, 4, 2048, 2, 512, steps=2),
    Case("tiny-gemma-qlora", "gemma", "qlora", 512, 2, 16000, 2, 128, steps=2),
    # more: activations with and without checkpointing, batch and sequence sizes, families
    Case("llama-full-act", "llama3_2", "full", 512, 6, 8000, 4, 512),
    Case("llama-full-act-ac", "llama3_2", "full", 512, 6, 8000, 4, 512, activation_checkpointing=True),
    Case("llama-lora-act", "llama3_2", "lora", 512, 6, 8000, 4, 512),
    Case("llama-lora-act-ac", "llama3_2", "lora", 512, 6, 8000, 4, 512, activation_checkpointing=True),
    Case("llama-qlora-b8", "llama3_2", "qlora", 768, 8, 8000, 8, 256),
    Case("qwen-full-s1024", "qwen2_5", "full", 512, 4, 16000, 2, 1024),
    Case("qwen-full-s1024-ac", "qwen2_5", "full", 512, 4, 16000, 2, 1024, activation_checkpointing=True),
    Case("gemma-full", "gemma", "full", 512, 4, 16000, 4, 256),
    Case("gemma-lora-ac", "gemma", "lora", 768, 6, 16000, 4, 512, activation_checkpointing=True),
]
# On a CUDA GPU (``--device cuda``): Llama 3.2 1B shapes in bf16, measured by torch.cuda.max_memory_allocated
GPU_CASES = [
    Case("gpu-1b-full", "llama3_2", "full", 2048, 16, 128256, 2, 2048, num_heads=32, num_kv_heads=8, steps=4),
    Case("gpu-1b-full-ac", "llama3_2", "full", 2048, 16, 128256, 2, 2048, True, 32, 8, steps=4),
    Case("gpu-1b-lora", "llama3_2", "lora", 2048, 16, 128256, 2, 2048, num_heads=32, num_kv_heads=8, steps=4),
    Case("gpu-1b-lora-ac", "llama3_2", "lora", 2048, 16, 128256, 4, 2048, True, 32, 8, steps=4),
    Case("gpu-1b-qlora", "llama3_2", "qlora", 2048, 16, 128256, 2, 2048, num_heads=32, num_kv_heads=8, steps=4),
    Case(
        "gpu-1b-full-ac-accum",
        "llama3_2",
        "full",
        2048,
        16,
        128256,
        2,
        2048,
        True,
        32,
        8,
        steps=2,
        extra=(("gradient_accumulation_steps", 2),),
    ),  # fmt: skip
    Case(
        "gpu-1b-full-in-bwd",
        "llama3_2",
        "full",
        2048,
        16,
        128256,
        1,
        2048,
        num_heads=32,
        num_kv_heads=8,
        steps=4,
        extra=(("optimizer_in_bwd", True),),
    ),  # fmt: skip
]
BASELINE_CASE = Case("baseline", "llama3_2", "full", 64, 1, 320, 1, 32, num_heads=4, num_kv_heads=2, steps=1)


def write_tokenizer(path: Path) -> None:
    """A SentencePiece BPE tokenizer with Llama-2 special ids, trained on generated text."""
    import sentencepiece as spm

    rng = random.Random(0)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(2000)]
    lines += [f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=TOKENIZER_VOCAB,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def write_alpaca(path: Path, num_samples: int = 600) -> None:
    """Alpaca rows of 20-200 tokens: enough packs of up to 1,024 tokens for every case's steps."""
    rng = random.Random(0)
    rows = []
    for _ in range(num_samples):
        a, b = rng.randrange(50), rng.randrange(50)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(5, 60)))
        rows.append({"instruction": f"Add the numbers. {words}", "input": f"{a} and {b}", "output": f"{a + b} {words}"})
    path.write_text(json.dumps(rows))


def _model_args(case: Case) -> dict:
    head_dim = case.embed_dim // case.num_heads
    args = {
        "vocab_size": case.vocab_size,
        "num_layers": case.num_layers,
        "num_heads": case.num_heads,
        "num_kv_heads": case.num_kv_heads,
        "embed_dim": case.embed_dim,
        "max_seq_len": max(1024, case.seq_len),
        "intermediate_dim": (4 if case.name.startswith("gpu-") else 3) * case.embed_dim,
    }
    for key, value in FAMILIES[case.family][2].items():
        args[key] = head_dim if key == "head_dim" else value
    return args


def checkpoint_dir(case: Case, assets: Path) -> Path:
    """Where the case's checkpoint goes: cases of one shape share it."""
    shape = (case.family, case.embed_dim, case.num_layers, case.vocab_size, case.num_heads, case.num_kv_heads)
    return assets / "-".join(str(x) for x in shape) if not case.name.startswith("gpu-") else assets / "gpu-1b"


def write_checkpoint(case: Case, directory: Path) -> None:
    """The family's full model, randomly initialised, in tune's checkpoint format (fp32 safetensors)."""
    import torch
    from safetensors.torch import save_file

    from tune.config import get_component_from_path

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = get_component_from_path(FAMILIES[case.family][0])(**_model_args(case))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if "output.weight" in state and state["output.weight"].data_ptr() == state["tok_embeddings.weight"].data_ptr():
        state.pop("output.weight")
    save_file(state, str(directory / "model.safetensors"))


def write_config(case: Case, assets: Path, out: Path, device: str = "cpu") -> Path:
    """The run's config: the case's model, packed alpaca, AdamW, LinearCrossEntropyLoss; fp32 on CPU, bf16 on
    CUDA."""
    full_builder, lora_builder, _ = FAMILIES[case.family]
    model = {"_component_": full_builder if case.method == "full" else lora_builder, **_model_args(case)}
    if case.method != "full":
        model.update(
            lora_attn_modules=["q_proj", "v_proj", "output_proj"],
            apply_lora_to_mlp=True,
            lora_rank=8,
            lora_alpha=16,
            quantize_base=case.method == "qlora",
        )
    run_dir = out / "run"  # emptied before each run: a second run is not refused as a resume
    cfg = {
        "output_dir": str(run_dir),
        "model": model,
        "tokenizer": {
            "_component_": "tune.models.llama2.llama2_tokenizer",
            "path": str(assets / "tokenizer.model"),
            "max_seq_len": case.seq_len,
            "prompt_template": None,
        },
        "checkpointer": {
            "_component_": "tune.training.FullModelTorchTuneCheckpointer",
            "checkpoint_dir": str(checkpoint_dir(case, assets)),
            "checkpoint_files": ["model.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": str(run_dir),
            "model_type": "LLAMA2",
        },
        "resume_from_checkpoint": False,
        "dataset": {
            "_component_": "tune.datasets.alpaca_dataset",
            "source": "json",
            "data_files": str(assets / "train.json"),
            "split": "train",
            "train_on_input": True,
            "packed": True,
        },
        "seed": 0,
        "shuffle": False,
        "batch_size": case.batch_size,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-4, "fused": True},
        "lr_scheduler": None,
        "loss": {"_component_": "tune.modules.loss.LinearCrossEntropyLoss"},
        "epochs": 1,
        "max_steps_per_epoch": case.steps,
        "gradient_accumulation_steps": 1,
        "clip_grad_norm": None,
        "compile": False,
        "optimizer_in_bwd": False,
        "metric_logger": {
            "_component_": "tune.training.metric_logging.DiskLogger",
            "log_dir": str(run_dir / "logs"),
            "filename": "log.jsonl",
        },
        "log_every_n_steps": 1,
        "log_peak_memory_stats": device == "cuda",
        "device": device,
        "dtype": "fp32" if device == "cpu" else "bf16",
        "enable_activation_checkpointing": case.activation_checkpointing,
        "enable_activation_offloading": False,
        "profiler": None,
    }
    if case.method != "full":
        cfg["save_adapter_weights_only"] = False
    cfg.update(dict(case.extra))
    path = out / "config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return path


def recipe_of(case: Case) -> str:
    return "full_finetune_single_device" if case.method == "full" else "lora_finetune_single_device"


# `python -c` program: runs `tune ARGS...` in this process and, at exit, copies /proc/self/status (VmHWM: the
# process's peak resident set) to the file named by the first argument
_RUN_AND_RECORD_PEAK = (
    "import atexit, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(open('/proc/self/status').read()))\n"
    "from tune._cli.main import main\n"
    "sys.argv[0] = 'tune'\n"
    "sys.exit(main())\n"
)


def measure(case: Case, config: Path, device: str = "cpu") -> tuple[int, float]:
    """Runs the case in a fresh process: (peak memory in bytes, wall seconds). On CPU the process's peak RSS; on
    CUDA the largest ``peak_memory_alloc`` (``torch.cuda.max_memory_allocated``) the recipe logged."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "2")
    # the peak is read inside the recipe's process (its VmHWM at exit): wait4's ru_maxrss would also count the RSS
    # this process had when it forked the child, which in a test worker is larger than the recipe's own peak
    peak_file = config.parent / "peak_rss.txt"
    peak_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", _RUN_AND_RECORD_PEAK, str(peak_file), "run", recipe_of(case), "--config", str(config)]
    shutil.rmtree(config.parent / "run", ignore_errors=True)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=config.parent, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, _ = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"{case.name}: `{' '.join(cmd)}` failed:\n{log.read().decode()[-4000:]}")
    seconds = time.perf_counter() - start
    if device == "cuda":
        records = [json.loads(line) for line in (config.parent / "run" / "logs" / "log.jsonl").read_text().splitlines()]
        return int(max(r["peak_memory_alloc"] for r in records if "peak_memory_alloc" in r) * 2**30), seconds
    return _read_peak_kib(peak_file) * 1024, seconds


def _read_peak_kib(path: Path) -> int:
    """The ``VmHWM`` (peak resident set, KiB) the recipe's process wrote at exit."""
    for line in path.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path} has no VmHWM line")


def estimate(case: Case, config: Path, baseline: bool = True) -> dict:
    """What `tune estimate` says for the case's config."""
    from tune._cli._estimate import estimate_config

    report = estimate_config(str(config), [], recipe=recipe_of(case), baseline=baseline, suggest=False)
    e = report.estimate
    return {"peak": e.peak, "phase": e.phase, "terms": e.terms, "num_params": e.num_params}


@dataclass
class Result:
    case: str
    family: str
    method: str
    activation_checkpointing: bool
    batch: str
    num_params: int
    estimate_mib: float
    measured_mib: float
    error_pct: float
    phase: str
    seconds: float


def run_case(case: Case, workdir: Path, assets: Path, device: str = "cpu") -> Result:
    """Writes the case's checkpoint and config, runs it, and compares (on CUDA without the baseline: the
    allocator's peak holds no CUDA context)."""
    if not (checkpoint_dir(case, assets) / "model.safetensors").is_file():
        write_checkpoint(case, checkpoint_dir(case, assets))
    config = write_config(case, assets, workdir / case.name, device)
    predicted = estimate(case, config, baseline=device == "cpu")
    measured, seconds = measure(case, config, device)
    return Result(
        case=case.name,
        family=case.family,
        method=case.method,
        activation_checkpointing=case.activation_checkpointing,
        batch=f"{case.batch_size}x{case.seq_len}",
        num_params=predicted["num_params"],
        estimate_mib=predicted["peak"] / 2**20,
        measured_mib=measured / 2**20,
        error_pct=100 * (predicted["peak"] - measured) / measured,
        phase=predicted["phase"],
        seconds=seconds,
    )


def make_assets(root: Path) -> Path:
    """The tokenizer and the dataset the cases share (checkpoints are written per case)."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "tokenizer.model").is_file():
        write_tokenizer(root / "tokenizer.model")
    if not (root / "train.json").is_file():
        write_alpaca(root / "train.json")
    return root


def table(results: list[Result]) -> str:
    lines = [
        "| case | family | method | AC | batch x seq | params | estimate MiB | measured MiB | error | peak at |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.case} | {r.family} | {r.method} | {'on' if r.activation_checkpointing else 'off'} | {r.batch} | "
            f"{r.num_params / 1e6:.1f}M | {r.estimate_mib:,.0f} | {r.measured_mib:,.0f} | {r.error_pct:+.1f}% | "
            f"{r.phase} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names; default: all")
    parser.add_argument("--baseline", action="store_true", help="measure the CPU process baseline")
    parser.add_argument("--workdir", type=Path, default=None, help="where assets and runs go; default: a temp dir")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: the GPU cases instead")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-estimate-"))
    assets = make_assets(workdir / "assets")
    if args.baseline:
        for method in ("full", "lora", "qlora"):
            case = replace(BASELINE_CASE, name=f"baseline-{method}", method=method)
            if not (checkpoint_dir(case, assets) / "model.safetensors").is_file():
                write_checkpoint(case, checkpoint_dir(case, assets))
            config = write_config(case, assets, workdir / case.name)
            others = estimate(case, config, baseline=False)["peak"]
            measured, _ = measure(case, config)
            print(
                f"{method}: peak RSS {measured / 2**20:.0f} MiB, other terms {others / 2**20:.1f} MiB: baseline "
                f"{(measured - others) / 2**20:.0f} MiB",
                flush=True,
            )
        return 0
    wanted = [w for w in args.cases.split(",") if w]
    results = []
    for case in CASES if args.device == "cpu" else GPU_CASES:
        if wanted and not any(w in case.name for w in wanted):
            continue
        results.append(run_case(case, workdir, assets, args.device))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(results))
    worst = max((abs(r.error_pct) for r in results), default=0.0)
    print(f"\nlargest error: {worst:.1f}% over {len(results)} runs")
    if args.output:
        args.output.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
