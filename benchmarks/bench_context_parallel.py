"""What context parallelism costs per training step: collective time and bytes per rank, against one process.

One command (from the repository root; CPU, gloo)::

    .venv/bin/python benchmarks/bench_context_parallel.py --seq-lens 4096,16384 --ranks 2,4

What runs: the shape of the peer harness's small Llama (dim 256, 4 layers, 4 query / 2 key-value heads of 64,
vocabulary 8,000, randomly initialised), fp32, activation checkpointing of every layer, ``LinearCrossEntropyLoss``,
AdamW, batch 1 of one sequence of ``S`` tokens; ``--steps`` steps (default 3), the first a warm-up. The
context-parallel rows run ``torchrun --nproc_per_node N`` with ``ContextParallel`` and FSDP2 over the ``cp`` ranks,
as ``full_finetune_distributed`` does; the 1-rank row is one process without either. Each rank times and counts
the collectives tune's context-parallel modules make (``torch.distributed.all_gather_single``,
``reduce_scatter_single``, ``all_reduce`` during the forward and backward passes: the key/value gathers, their
gradients' sums, the loss sum; FSDP's own collectives are not counted) through a wrapped ``torch.distributed``
given to those two modules in the worker.

Columns: step seconds (mean over the measured steps, rank 0), seconds inside those collectives and their share of
the step, MiB each rank sends and receives in them per step (all-gather: (N - 1) / N of the gathered tensor in,
the local part out to N - 1 ranks; gloo has no reduce-scatter, so gradient sums are all-reduces of the gathered
size: ring cost 2 (N - 1) / N of it each way). The bytes are exact; the times are of gloo over shared memory on
this machine, not of NCCL. Step peak MiB: rank 0's peak RSS during the steps minus its RSS peak before the first
(the weights and the batch): activations, gradients, AdamW's state and the collectives' buffers, which grow with
``S / N`` per rank, plus what grows with ``S`` (the gathered keys and values of one layer and their gradients).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(
    vocab_size=8000, num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=256, intermediate_dim=704, max_seq_len=0
)


def _worker(seq_len: int, steps: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from tune.models.llama2 import llama2
    from tune.modules import TransformerSelfAttentionLayer
    from tune.modules.loss import LinearCrossEntropyLoss
    from tune.training import ContextParallel, apply_activation_checkpointing, fsdp_mesh, init_device_mesh, shard_model

    world = int(os.environ.get("WORLD_SIZE", "1"))
    context_parallel, stats = ContextParallel(), {"seconds": 0.0, "bytes": 0}
    torch.manual_seed(0)
    model = llama2(**{**SHAPE, "max_seq_len": seq_len})
    apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
    if world > 1:
        dist.init_process_group("gloo")
        mesh = init_device_mesh(world, 1, "cpu", context_parallel_dim=world)
        shard_model(model, [TransformerSelfAttentionLayer], dp_mesh=fsdp_mesh(mesh))
        context_parallel = ContextParallel(mesh["cp"])
        _count_collectives(stats, world)
    loss_fn = LinearCrossEntropyLoss(reduction="sum")
    loss_fn.set_model_output(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, seq_len), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, 1)
    times, collective_seconds, collective_bytes = [], [], []
    before = _peak_rss_mib()  # weights, optimizer not yet allocated; the batch
    for step in range(steps):
        stats.update(seconds=0.0, bytes=0, counting=True)
        start = time.perf_counter()
        local_tokens, local_labels, inputs = context_parallel.shard(tokens, labels, {})
        loss = context_parallel.sum(loss_fn(model(local_tokens, **inputs), local_labels)) / seq_len
        loss.backward()
        stats["counting"] = False  # FSDP's optimizer-side work is not context parallelism's
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:  # the first step warms up
            times.append(time.perf_counter() - start)
            collective_seconds.append(stats["seconds"])
            collective_bytes.append(stats["bytes"])
    if int(os.environ.get("RANK", "0")) == 0:
        result = {"ranks": world, "seq_len": seq_len, "step_s": sum(times) / len(times)}
        result.update(collective_s=sum(collective_seconds) / len(times), mib=collective_bytes[-1] / 2**20)
        result["step_peak_mib"] = _peak_rss_mib() - before
        out.write_text(json.dumps(result))
    if world > 1:
        dist.destroy_process_group()


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def _count_collectives(stats: dict, world: int) -> None:
    """Gives tune's context-parallel modules a ``torch.distributed`` whose collectives add their time and per-rank
    traffic to ``stats`` while ``stats["counting"]`` (sent + received bytes, gloo's ring algorithms); FSDP and the
    rest of torch keep the real module."""
    import types

    import torch.distributed as dist

    from tune.modules import _context_parallel as attention
    from tune.training import _context_parallel as training

    def timed(function, traffic):
        def wrapper(*args, **kwargs):
            if not stats.get("counting"):
                return function(*args, **kwargs)
            start = time.perf_counter()
            result = function(*args, **kwargs)
            stats["seconds"] += time.perf_counter() - start
            stats["bytes"] += traffic(*args)
            return result

        return wrapper

    def gathered(output, _input, *rest):  # receive (N - 1) / N of the output, send the local part to N - 1 ranks
        return 2 * output.numel() * output.element_size() * (world - 1) // world

    def reduced(tensor, *rest):  # ring all-reduce: 2 (N - 1) / N of the tensor each way
        return 4 * tensor.numel() * tensor.element_size() * (world - 1) // world

    def scattered(output, _input, *rest):
        return 2 * output.numel() * output.element_size() * (world - 1)

    counted = types.SimpleNamespace(**{name: getattr(dist, name) for name in dir(dist) if not name.startswith("__")})
    counted.all_gather_single = timed(dist.all_gather_single, gathered)
    counted.all_reduce = timed(dist.all_reduce, reduced)
    counted.reduce_scatter_single = timed(dist.reduce_scatter_single, scattered)
    attention.dist = training.dist = counted


def _run(ranks: int, seq_len: int, steps: int, workdir: Path) -> dict:
    out = workdir / f"cp{ranks}_{seq_len}.json"
    worker = [str(Path(__file__).resolve()), "--worker", str(seq_len), "--steps", str(steps), "--out", str(out)]
    if ranks == 1:
        command = [sys.executable, *worker]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *worker]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks))}
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="4096,16384")
    parser.add_argument("--ranks", default="2,4", help="context-parallel sizes (a 1-rank row is always run)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "context_parallel")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.steps, args.out)
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    lines = [
        "| S | ranks | step s | in collectives s | share | MiB sent + received per rank | step peak MiB (rank 0) |",
        "|---|---|---|---|---|---|---|",
    ]
    results = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        for ranks in [1, *(int(r) for r in args.ranks.split(","))]:
            result = _run(ranks, seq_len, args.steps, args.workdir)
            results.append(result)
            share = result["collective_s"] / result["step_s"]
            lines.append(
                f"| {seq_len:,} | {ranks} | {result['step_s']:.2f} | {result['collective_s']:.2f} | {share:.0%} "
                f"| {result['mib']:,.0f} | {result['step_peak_mib']:,.0f} |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    (args.workdir / "bench_context_parallel.json").write_text(json.dumps(results, indent=2))
    (args.workdir / "bench_context_parallel.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
