"""The torch profiler behind the recipes' ``profiler:`` config section."""

import os
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from tune.utils import get_logger, get_rank

log = get_logger(name=__name__)

# torchtune's names for the profiler's config section and its defaults
PROFILER_KEY = "profiler"
DEFAULT_PROFILER_ACTIVITIES = {ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.XPU}
DEFAULT_SCHEDULE: dict[str, int] = {"wait_steps": 5, "warmup_steps": 5, "active_steps": 2, "num_cycles": 1}
DEFAULT_TRACE_OPTS: dict[str, bool] = {
    "profile_memory": False,
    "with_stack": False,
    "record_shapes": True,
    "with_flops": False,
}
DEFAULT_PROFILE_DIR = "profiler_output"


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
    cpu: bool = True,
    cuda: bool = True,
    xpu: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
    record_shapes: bool = True,
    with_flops: bool = False,
    wait_steps: int | None = None,
    warmup_steps: int | None = None,
    active_steps: int | None = None,
    num_cycles: int | None = None,
    output_dir: str | Path | None = None,
    row_limit: int = 25,
    **kwargs: Any,
) -> tuple[profile | DummyProfiler, dict[str, Any]]:
    """Builds a ``torch.profiler.profile`` that records ``active_steps`` steps after ``wait + warmup`` steps, and
    returns it with the settings it used (as torchtune does).

    The recipe enters it around the training loop and calls ``profiler.step()`` after every optimizer step.
    Each recorded window writes ``rank<R>_step<N>_trace.json`` (Chrome/Perfetto trace) and a summary table to
    ``output_dir``. Schedule values left as None take :data:`DEFAULT_SCHEDULE`'s.

    Args:
        enabled (bool): ``False`` returns a :class:`DummyProfiler`, so the loop code is the same either way.
        cpu (bool): record CPU activity. Default True.
        cuda (bool): record CUDA activity (ignored without a GPU). Default True.
        xpu (bool): record XPU activity (ignored without one). Default True.
        profile_memory (bool): record tensor allocations (turns on ``with_stack`` and ``record_shapes``, which
            torch's memory profile needs). Default False.
        with_stack (bool): record Python stacks (large traces). Default False.
        record_shapes (bool): record operator input shapes. Default True.
        with_flops (bool): estimate FLOPs of matmuls and convolutions. Default False.
        wait_steps (int | None): steps skipped before warming up. Default None (5).
        warmup_steps (int | None): steps profiled but discarded (the profiler's own start-up cost). Default None (5).
        active_steps (int | None): steps recorded. Default None (2).
        num_cycles (int | None): how many wait/warmup/active windows to record. Default None (1).
        output_dir (str | Path | None): where traces go. Default None: :data:`DEFAULT_PROFILE_DIR`.
        row_limit (int): rows in the summary table. Default 25.
        **kwargs: ignored with a warning (lets a config carry keys of other profiler versions without failing).

    Returns:
        tuple[torch.profiler.profile | DummyProfiler, dict[str, Any]]: the profiler, and the settings it resolved
        (``{"enabled": False}`` when disabled).

    Raises:
        ValueError: with no activity selected, or with negative step counts.
    """
    if not enabled:
        return DummyProfiler(), {"enabled": False}
    given = {"wait_steps": wait_steps, "warmup_steps": warmup_steps, "active_steps": active_steps}
    given["num_cycles"] = num_cycles
    steps = {key: DEFAULT_SCHEDULE[key] if value is None else value for key, value in given.items()}
    defaulted = [key for key, value in given.items() if value is None]
    if defaulted and get_rank() == 0:
        log.info(f"profiler: {', '.join(f'{key}={steps[key]}' for key in defaulted)} (defaults)")
    if min(steps["wait_steps"], steps["warmup_steps"]) < 0 or steps["active_steps"] < 1 or steps["num_cycles"] < 1:
        raise ValueError(
            "Profiler steps must be wait_steps>=0, warmup_steps>=0, active_steps>=1, num_cycles>=1; received "
            f"{steps['wait_steps']}, {steps['warmup_steps']}, {steps['active_steps']}, {steps['num_cycles']}."
        )
    activities = [ProfilerActivity.CPU] if cpu else []
    if cuda and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    if xpu and hasattr(torch, "xpu") and torch.xpu.is_available():
        activities.append(ProfilerActivity.XPU)
    if not activities:
        raise ValueError("The profiler has nothing to record: set profiler.cpu=True (or cuda=True on a GPU machine).")
    if kwargs:
        log.warning(f"setup_torch_profiler ignores unknown settings: {sorted(kwargs)}")
    if output_dir is None:
        output_dir = DEFAULT_PROFILE_DIR
        log.info(f"profiler: output_dir={DEFAULT_PROFILE_DIR} (default)")
    # torch's memory profile is built from stacks and shapes
    with_stack = with_stack or profile_memory
    record_shapes = record_shapes or profile_memory
    profiler = profile(
        activities=activities,
        schedule=schedule(
            wait=steps["wait_steps"],
            warmup=steps["warmup_steps"],
            active=steps["active_steps"],
            repeat=steps["num_cycles"],
        ),
        on_trace_ready=_trace_handler(Path(os.fspath(output_dir)), row_limit),
        profile_memory=profile_memory,
        with_stack=with_stack,
        record_shapes=record_shapes,
        with_flops=with_flops,
    )
    settings = {
        "enabled": enabled,
        "output_dir": str(output_dir),
        "cpu": cpu,
        "cuda": cuda,
        "xpu": xpu,
        "profile_memory": profile_memory,
        "with_stack": with_stack,
        "record_shapes": record_shapes,
        "with_flops": with_flops,
        **steps,
    }
    return profiler, settings
