"""Batched sampling speed of ``tune.generation.generate``: what GRPO's and PPO's rollouts spend their steps in.

Builds a randomly initialised Llama 3.2 1B (or a tiny model with ``--tiny``), left-pads a batch of prompts and
samples ``--new-tokens`` tokens per row with one generator per row (as the GRPO recipes do), in eager mode and
with the decode step compiled (``--compile``). Prints new tokens per second and, with ``--profile``, the operators
that took the most time in one run and how many times the host waited for the device.

    python benchmarks/bench_generate.py --device cuda --batch 32 --new-tokens 128 --profile
    python benchmarks/bench_generate.py --tiny --device cpu --new-tokens 8     # the wiring, on any machine
"""

import argparse
import json
import time
from pathlib import Path

import torch

from tune import generation
from tune.models.llama3_1 import llama3_1
from tune.models.llama3_2 import llama3_2_1b


def build_model(tiny: bool, device: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("meta"):
        if tiny:
            model = llama3_1(
                vocab_size=512,
                num_layers=2,
                num_heads=8,
                num_kv_heads=2,
                embed_dim=256,
                max_seq_len=1024,
                intermediate_dim=512,
            )
        else:
            model = llama3_2_1b()
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    for m in model.modules():  # RoPE tables, left empty by to_empty
        if hasattr(m, "rope_init"):
            m.rope_init()
    return model.eval()


def run(model, prompts, args, custom=None) -> tuple[float, int]:
    generators = [torch.Generator(device=args.device).manual_seed(i) for i in range(len(prompts))]
    if args.device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    sequences, _ = generation.generate(
        model,
        prompts,
        max_generated_tokens=args.new_tokens,
        pad_id=0,
        temperature=1.0,
        rng=generators,
        return_logits=False,
        custom_generate_next_token=custom,
    )
    if args.device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    new = sequences.shape[1] - max(len(p) for p in prompts)
    return elapsed, new * len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--compile", action="store_true", help="also time the decode step under torch.compile")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_model(args.tiny, args.device, dtype)
    vocab = model.tok_embeddings.num_embeddings
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (args.batch,), generator=g)
    prompts = [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in lengths]
    rows = []
    variants = {"eager": None}
    if args.compile:
        # the KV caches' fill counts are Python ints on the modules: symbolic, so one graph serves every step
        torch._dynamo.config.allow_unspec_int_on_nn_module = True
        variants["compiled decode step"] = torch.compile(generation.generate_next_token, dynamic=True)
    for name, custom in variants.items():
        run(model, prompts[:2], argparse.Namespace(**{**vars(args), "new_tokens": 4}), custom)  # warm up
        elapsed, new = run(model, prompts, args, custom)
        rows.append((name, elapsed, new))
        if args.profile and name == "eager":
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
            short = argparse.Namespace(**{**vars(args), "new_tokens": min(args.new_tokens, 16)})
            with profile(activities=activities) as prof:
                run(model, prompts, short, custom)
            sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=sort, row_limit=15))
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            events = prof.key_averages()
            syncs = sum(e.count for e in events if "Synchronize" in e.key or "MemcpyAsync" in e.key)
            print(f"host waits (cudaStreamSynchronize / cudaDeviceSynchronize / cudaMemcpyAsync calls): {syncs}")
    size = "tiny" if args.tiny else "1B"
    print(f"\n| {args.batch} rows x {args.new_tokens} new tokens, {size}, {args.device} | s | new tokens/s |")
    print("|---|---|---|")
    for name, elapsed, new in rows:
        print(f"| {name} | {elapsed:.2f} | {new / elapsed:,.0f} |")
    if args.json is not None:
        records = [{"variant": n, "seconds": e, "new_tokens": t, "tokens_per_s": t / e} for n, e, t in rows]
        args.json.write_text(json.dumps({"size": size, "batch": args.batch, "rows": records}))


if __name__ == "__main__":
    main()
