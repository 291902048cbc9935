"""Forward+backward throughput and peak memory: tune's decoder vs transformers' LlamaForCausalLM, same weights.

    .venv/bin/python benchmarks/bench_models.py                       # defaults below (~100M params, CPU, fp32)
    .venv/bin/python benchmarks/bench_models.py --steps 1 --rounds 2  # a quick run
    .venv/bin/python benchmarks/bench_models.py --device cuda --dtype bfloat16 --steps 20

The model is Llama-3.2-shaped (GQA 12/4 heads, tied embeddings, Llama 3.1-style RoPE scaling) at a CPU size:
vocab 32000, width 768, 12 layers, FFN 2048 (~100M parameters). A random transformers model is saved once with
save_pretrained; each implementation then runs in its own subprocess (so peak memory is its own), loads those
weights (``tune.models.from_hf`` / ``from_pretrained``) and times full training steps: forward, cross-entropy on
all logits, backward. Implementations alternate over ``--rounds`` so background load hits both alike; the table
gives the best and the median step, and the best process CPU time per step (less sensitive than wall time to
other processes on a shared machine). Memory is the process's peak RSS (CPU) or
``torch.cuda.max_memory_allocated`` (CUDA), reported in total and as the growth during training steps. Prints a
table and writes JSON (``--output``).
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

CONFIG = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=500_000.0,
    rope_scaling=dict(
        rope_type="llama3",
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=1024,
    ),
    tie_word_embeddings=True,
)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _load(impl: str, checkpoint: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    if impl == "tune":
        sys.path.insert(0, str(ROOT))
        from tune.models import from_hf

        return from_hf(checkpoint, dtype=dtype, device=device)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation="sdpa").to(device)


def _step(impl: str, model: torch.nn.Module, tokens: torch.Tensor) -> None:
    logits = model(tokens) if impl == "tune" else model(input_ids=tokens, use_cache=False).logits
    # next-token loss on every position: the same work for both
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


def run_one(impl: str, checkpoint: str, args: argparse.Namespace) -> dict:
    """Runs in a subprocess: load, warm up, time ``args.steps`` training steps, report memory."""
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = _load(impl, checkpoint, args.device, dtype).train()
    num_params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, CONFIG["vocab_size"], (args.batch_size, args.seq_len), device=args.device)
    cuda = args.device.startswith("cuda")
    rss_before = _peak_rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated() / 2**20
    for _ in range(args.warmup):
        _step(impl, model, tokens)
    if cuda:
        torch.cuda.synchronize()
    step_seconds, step_cpu_seconds = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        _step(impl, model, tokens)
        if cuda:
            torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - start)
        step_cpu_seconds.append(time.process_time() - cpu_start)
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
        growth = peak - base_mem
    else:
        peak = _peak_rss_mb()
        growth = peak - rss_before
    return {
        "impl": impl,
        "params_m": num_params / 1e6,
        "tokens_per_step": tokens.numel(),
        "step_seconds": step_seconds,
        "step_cpu_seconds": step_cpu_seconds,
        "peak_memory_mb": peak,
        "step_memory_growth_mb": growth,
    }


def _summarise(impl: str, runs: list[dict]) -> dict:
    steps = sorted(t for run in runs for t in run["step_seconds"])
    tokens = runs[0]["tokens_per_step"]
    return {
        "impl": impl,
        "params_m": runs[0]["params_m"],
        "tokens_per_s_best": tokens / steps[0],
        "tokens_per_s_median": tokens / steps[len(steps) // 2],
        "step_seconds": steps,
        "cpu_seconds_per_step_best": min(t for run in runs for t in run["step_cpu_seconds"]),
        "peak_memory_mb": max(run["peak_memory_mb"] for run in runs),
        "step_memory_growth_mb": max(run["step_memory_growth_mb"] for run in runs),
    }


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each implementation")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output", default="bench_models.json")
    parser.add_argument("--impls", default="tune,transformers")
    parser.add_argument("--_child", nargs=2, metavar=("IMPL", "CHECKPOINT"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = _parse(argv)
    if args._child:
        print(json.dumps(run_one(args._child[0], args._child[1], args)))
        return
    from transformers import AutoModelForCausalLM, LlamaConfig

    skip = ("_child", "output", "impls", "rounds")
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in skip]
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as checkpoint:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).save_pretrained(checkpoint)
        # alternate implementations over rounds so background load hits both alike; keep each one's best step
        for _ in range(args.rounds):
            for impl in args.impls.split(","):
                command = [sys.executable, __file__, *forwarded, "--_child", impl, checkpoint]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                runs.setdefault(impl, []).append(json.loads(out.strip().splitlines()[-1]))
    results = [_summarise(impl, impl_runs) for impl, impl_runs in runs.items()]
    print(
        f"batch {args.batch_size} x seq {args.seq_len}, {args.dtype}, {args.device}, "
        f"{args.rounds} rounds x {args.steps} timed steps (best and median step)"
    )
    header = (
        f"{'impl':<13}{'params (M)':>11}{'tokens/s best':>15}{'tokens/s median':>17}{'CPU s/step':>12}"
        f"{'peak mem (MB)':>15}{'step growth (MB)':>18}"
    )
    print(header)
    for r in results:
        print(
            f"{r['impl']:<13}{r['params_m']:>11.1f}{r['tokens_per_s_best']:>15.1f}{r['tokens_per_s_median']:>17.1f}"
            f"{r['cpu_seconds_per_step_best']:>12.1f}{r['peak_memory_mb']:>15.0f}{r['step_memory_growth_mb']:>18.0f}"
        )
    Path(args.output).write_text(json.dumps({"config": CONFIG, "args": vars(args), "results": results}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
