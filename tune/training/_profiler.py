"""The torch profiler behind the recipes' ``profiler:`` config section."""

import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from tune.utils import get_logger, get_rank

log = get_logger(__name__)


class DummyProfiler:
    """Stands in for ``torch.profiler.profile`` when profiling is off: every method is a no-op."""

    def __enter__(self) -> "DummyProfiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def start(self) -> None:
        """No-op."""

    def stop(self) -> None:
        """No-op."""

    def step(self) -> None:
        """No-op."""


def _trace_handler(output_dir: Path, row_limit: int):
    def write(prof: profile) -> None:
        rank = get_rank()
        output_dir.mkdir(parents=True, exist_ok=True)
        trace = output_dir / f"rank{rank}_step{prof.step_num}_trace.json"
        prof.export_chrome_trace(str(trace))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
        (output_dir / f"rank{rank}_step{prof.step_num}_summary.txt").write_text(table)
        if rank == 0:
            log.info(f"Profiler trace written to {trace} (open in chrome://tracing or https://ui.perfetto.dev)")

    return write


def setup_torch_profiler(
    enabled: bool = False,
    output_dir: str | Path | None = None,
    cpu: bool = True,
    cuda: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
    record_shapes: bool = True,
    with_flops: bool = False,
    wait_steps: int = 5,
    warmup_steps: int = 3,
    active_steps: int = 2,
    num_cycles: int = 1,
    row_limit: int = 25,
    **kwargs: Any,
) -> profile | DummyProfiler:
    """Builds a ``torch.profiler.profile`` that records ``active_steps`` steps after ``wait + warmup`` steps.

    The recipe enters it around the training loop and calls ``profiler.step()`` after every optimizer step.
    Each recorded window writes ``rank<R>_step<N>_trace.json`` (Chrome/Perfetto trace) and a summary table to
    ``output_dir``.

    Args:
        enabled (bool): ``False`` returns a :class:`DummyProfiler`, so the loop code is the same either way.
        output_dir (str | Path | None): where traces go; required when enabled.
        cpu (bool): record CPU activity.
        cuda (bool): record CUDA activity (ignored without a GPU).
        profile_memory (bool): record tensor allocations.
        with_stack (bool): record Python stacks (large traces).
        record_shapes (bool): record operator input shapes.
        with_flops (bool): estimate FLOPs of matmuls and convolutions.
        wait_steps (int): steps skipped before warming up.
        warmup_steps (int): steps profiled but discarded (the profiler's own start-up cost).
        active_steps (int): steps recorded.
        num_cycles (int): how many wait/warmup/active windows to record.
        row_limit (int): rows in the summary table.
        **kwargs: ignored (lets a config carry keys of other profiler versions without failing).

    Returns:
        torch.profiler.profile | DummyProfiler: the profiler.

    Raises:
        ValueError: if enabled without ``output_dir``, with no activity selected, or with negative step counts.
    """
    if not enabled:
        return DummyProfiler()
    if output_dir is None:
        raise ValueError(
            "profiler.enabled=True needs profiler.output_dir, e.g. `profiler.output_dir=${output_dir}/profiles`."
        )
    if min(wait_steps, warmup_steps) < 0 or active_steps < 1 or num_cycles < 1:
        raise ValueError(
            f"Profiler steps must be wait_steps>=0, warmup_steps>=0, active_steps>=1, num_cycles>=1; received "
            f"{wait_steps}, {warmup_steps}, {active_steps}, {num_cycles}."
        )
    activities = [ProfilerActivity.CPU] if cpu else []
    if cuda and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    if not activities:
        raise ValueError("The profiler has nothing to record: set profiler.cpu=True (or cuda=True on a GPU machine).")
    if kwargs:
        log.warning(f"setup_torch_profiler ignores unknown settings: {sorted(kwargs)}")
    return profile(
        activities=activities,
        schedule=schedule(wait=wait_steps, warmup=warmup_steps, active=active_steps, repeat=num_cycles),
        on_trace_ready=_trace_handler(Path(os.fspath(output_dir)), row_limit),
        profile_memory=profile_memory,
        with_stack=with_stack,
        record_shapes=record_shapes,
        with_flops=with_flops,
    )
