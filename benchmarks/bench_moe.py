"""Forward+backward throughput and peak memory of a small Qwen3-MoE: tune's two expert paths vs transformers.

    .venv/bin/python benchmarks/bench_moe.py                                  # defaults below (CPU, fp32, 4 x 512)
    .venv/bin/python benchmarks/bench_moe.py --steps 1 --rounds 1 --seq-len 64  # a quick run
    .venv/bin/python benchmarks/bench_moe.py --rounds 3 --steps 4 --threads 1   # the README's table

The model is Qwen3-MoE-shaped at a CPU size (``CONFIG``): vocab 8192, width 512, 6 layers (8 query / 4 key-value
heads of 64, QK-norm, RoPE theta 1e6), layer 2 dense (``mlp_only_layers``, feed-forward 1536), the other 5 sparse
with 16 experts of width 256, 4 per token, top-k weights renormalised, no shared expert (Qwen3-30B-A3B has experts
of width 768 at model width 2048, 8 of 128 per token): 47.0M parameters, 19.2M active per token besides the
embeddings. A random ``Qwen3MoeForCausalLM`` (fp32) is saved once with ``save_pretrained`` (per-expert tensors).
Systems, each in its own subprocess (so peak memory is its own):

- ``tune_loop``: tune's model built by ``qwen3_moe_from_hf_config``, weights through the family's converter
  ``qwen3_moe_hf_to_tune``; ``SwiGLUExperts`` with a loop over experts (``use_grouped_mm=False``, the default);
- ``tune_grouped``: the same model with ``use_grouped_mm=True`` (one ``torch._grouped_mm`` per projection);
- ``transformers``: ``from_pretrained`` with transformers' default experts implementation (``grouped_mm`` in
  transformers 5 with torch >= 2.9; the table and JSON say which one ran);
- ``transformers_eager``: ``experts_implementation="eager"`` (its loop over the experts that received tokens).

All use PyTorch's scaled-dot-product attention (transformers: ``attn_implementation="sdpa"``), causal, no mask.
Before timing, each system's logits on a fixed 2 x 64 batch are compared with transformers' eager logits (saved
by the parent): a max-abs difference above ``--parity-tol`` stops the benchmark. A training step is forward,
cross-entropy on every position's next token, backward, ``zero_grad`` (no optimizer step and no load-balancing
loss: the same work for every system, as in ``bench_models.py``) on one batch of random tokens. Systems alternate
over ``--rounds`` so background load hits all alike; the table gives the median and best step over all rounds and
the median process CPU time per step (less sensitive than wall time to other processes on a shared machine), with
ratios to transformers' (speed: higher is faster). ``--threads`` sets torch's threads in every system. Memory: the
process's peak RSS during the warm-up and timed steps (the peak is reset with ``/proc/self/clear_refs`` after
loading, so loading does not count; where that is not allowed, the peak since start) and its growth over the RSS
before the first step (activations and gradients); on CUDA ``torch.cuda.max_memory_allocated``. Prints a markdown
table (with the machine's load average at start and end) and writes JSON (``--output``, default
``benchmarks/results/moe.json``).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

CONFIG = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    moe_intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    num_experts=16,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[2],
    max_position_embeddings=1024,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
IMPLS = ("tune_loop", "tune_grouped", "transformers", "transformers_eager")
PARITY_SHAPE = (2, 64)  # small, so that no router decision is a float32 tie between implementations
REFERENCE = "reference_logits.pt"


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> bool:
    # writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_mb(reset: bool) -> float:
    if reset:
        return _rss_mb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _load(impl: str, checkpoint: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    if impl.startswith("tune"):
        sys.path.insert(0, str(ROOT))
        from safetensors.torch import load_file

        from tune.models.qwen3_moe import qwen3_moe_from_hf_config, qwen3_moe_hf_to_tune
        from tune.modules.moe import moe_layers

        hf_config = json.loads((Path(checkpoint) / "config.json").read_text())
        model = qwen3_moe_from_hf_config(hf_config)
        model.load_state_dict(qwen3_moe_hf_to_tune(load_file(Path(checkpoint) / "model.safetensors"), hf_config))
        for layer in moe_layers(model):
            layer.experts.use_grouped_mm = impl == "tune_grouped"
        return model.to(device=device, dtype=dtype)
    from transformers import AutoModelForCausalLM

    experts = {"experts_implementation": "eager"} if impl == "transformers_eager" else {}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation="sdpa", **experts)
    return model.to(device)


def _logits(impl: str, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(tokens) if impl.startswith("tune") else model(input_ids=tokens, use_cache=False).logits


def _step(impl: str, model: torch.nn.Module, tokens: torch.Tensor) -> None:
    logits = _logits(impl, model, tokens)
    # next-token loss on every position: the same work for all
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


def _experts_implementation(impl: str, model: torch.nn.Module) -> str:
    if impl.startswith("tune"):
        return "grouped_mm" if impl == "tune_grouped" else "loop"
    return str(model.config._experts_implementation)


def run_one(impl: str, checkpoint: str, args: argparse.Namespace) -> dict:
    """Runs in a subprocess: load, check logits, warm up, time ``args.steps`` training steps, report memory."""
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = _load(impl, checkpoint, args.device, dtype)
    reference = torch.load(Path(checkpoint) / REFERENCE, weights_only=True)
    with torch.no_grad():
        logits = _logits(impl, model.eval(), reference["tokens"].to(args.device)).float().cpu()
    parity_error = (logits - reference["logits"]).abs().max().item()
    model.train()
    num_params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, CONFIG["vocab_size"], (args.batch_size, args.seq_len), device=args.device)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated() / 2**20
    reset = _reset_peak_rss()
    rss_before = _rss_mb("VmRSS") if reset else _peak_rss_mb(reset)
    if parity_error <= args.parity_tol:  # a failed check is reported by the parent, without timing
        for _ in range(args.warmup):
            _step(impl, model, tokens)
    if cuda:
        torch.cuda.synchronize()
    step_seconds, step_cpu_seconds = [], []
    for _ in range(args.steps if parity_error <= args.parity_tol else 0):
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
        peak = _peak_rss_mb(reset)
        growth = peak - rss_before
    return {
        "impl": impl,
        "experts_implementation": _experts_implementation(impl, model),
        "params_m": num_params / 1e6,
        "tokens_per_step": tokens.numel(),
        "parity_max_abs_error": parity_error,
        "step_seconds": step_seconds,
        "step_cpu_seconds": step_cpu_seconds,
        "peak_memory_mb": peak,
        "peak_reset_after_load": reset,
        "step_memory_growth_mb": growth,
    }


def _summarise(impl: str, runs: list[dict]) -> dict:
    steps = sorted(t for run in runs for t in run["step_seconds"])
    tokens = runs[0]["tokens_per_step"]
    return {
        "impl": impl,
        "experts_implementation": runs[0]["experts_implementation"],
        "params_m": runs[0]["params_m"],
        "parity_max_abs_error": max(run["parity_max_abs_error"] for run in runs),
        "tokens_per_s_median": tokens / statistics.median(steps),
        "tokens_per_s_best": tokens / steps[0],
        "step_seconds": steps,
        "cpu_seconds_per_step_median": statistics.median(t for run in runs for t in run["step_cpu_seconds"]),
        "step_seconds_by_round": [run["step_seconds"] for run in runs],
        "cpu_seconds_per_step_best": min(t for run in runs for t in run["step_cpu_seconds"]),
        "peak_memory_mb": max(run["peak_memory_mb"] for run in runs),
        "peak_reset_after_load": all(run["peak_reset_after_load"] for run in runs),
        "step_memory_growth_mb": max(run["step_memory_growth_mb"] for run in runs),
    }


def _save_checkpoint(directory: str) -> None:
    """A random transformers Qwen3-MoE (fp32) and its eager logits on the parity batch, in ``directory``."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**CONFIG), experts_implementation="eager").eval()
    model.save_pretrained(directory)
    tokens = torch.randint(0, CONFIG["vocab_size"], PARITY_SHAPE)
    with torch.no_grad():
        logits = model(input_ids=tokens, use_cache=False).logits
    torch.save({"tokens": tokens, "logits": logits}, Path(directory) / REFERENCE)


def _table(results: list[dict], args: argparse.Namespace, meta: dict) -> str:
    reference = next((r for r in results if r["impl"] == "transformers"), None)
    rows = [
        f"batch {args.batch_size} x seq {args.seq_len}, {args.dtype}, {args.device}, {meta['threads']} threads, "
        f"{args.rounds} rounds x {args.steps} timed steps, load average {meta['load_average_start']:.1f} -> "
        f"{meta['load_average_end']:.1f}; ratios: this system over transformers (speed: higher is faster)",
        "",
        "| system | experts | logits max-abs vs transformers eager | tokens/s median | tokens/s best | tok/s ratio | "
        "CPU s/step median | CPU-time ratio | peak RSS MiB | step growth MiB | growth ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        speed = cpu = growth = "-"
        if reference is not None and r is not reference:
            speed = f"{r['tokens_per_s_median'] / reference['tokens_per_s_median']:.2f}"
            cpu = f"{reference['cpu_seconds_per_step_median'] / r['cpu_seconds_per_step_median']:.2f}"
            growth = f"{r['step_memory_growth_mb'] / reference['step_memory_growth_mb']:.2f}"
        rows.append(
            f"| {r['impl']} | {r['experts_implementation']} | {r['parity_max_abs_error']:.1e} | "
            f"{r['tokens_per_s_median']:,.0f} | {r['tokens_per_s_best']:,.0f} | {speed} | "
            f"{r['cpu_seconds_per_step_median']:.2f} | {cpu} | {r['peak_memory_mb']:,.0f} | "
            f"{r['step_memory_growth_mb']:,.0f} | {growth} |"
        )
    return "\n".join(rows)


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each system")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per system; 0: torch's default")
    parser.add_argument("--parity-tol", type=float, default=1e-4, help="largest logit difference accepted")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "moe.json"))
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, from {', '.join(IMPLS)}")
    parser.add_argument("--_child", nargs=2, metavar=("IMPL", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.impls.split(",")) - set(IMPLS))
    if unknown:
        parser.error(f"--impls: unknown system(s) {unknown}; choose from {', '.join(IMPLS)}")
    return args


def main(argv=None) -> None:
    args = _parse(argv)
    if args._child:
        print(json.dumps(run_one(args._child[0], args._child[1], args)))
        return
    skip = ("_child", "output", "impls", "rounds")
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in skip]
    runs: dict[str, list[dict]] = {}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as checkpoint:
        _save_checkpoint(checkpoint)
        # alternate systems over rounds so background load hits all alike
        for _ in range(args.rounds):
            for impl in args.impls.split(","):
                command = [sys.executable, __file__, *forwarded, "--_child", impl, checkpoint]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                run = json.loads(out.strip().splitlines()[-1])
                if run["parity_max_abs_error"] > args.parity_tol:
                    sys.exit(
                        f"{impl}: logits differ from transformers' by {run['parity_max_abs_error']:.2e} (more than "
                        f"--parity-tol {args.parity_tol:g}); not timed."
                    )
                runs.setdefault(impl, []).append(run)
    import transformers

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads or torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,  # 1-minute load average: other processes on the machine
        "load_average_end": os.getloadavg()[0],
    }
    results = [_summarise(impl, impl_runs) for impl, impl_runs in runs.items()]
    print(_table(results, args, meta))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"config": CONFIG, "args": vars(args), "meta": meta, "results": results}, indent=2))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
