"""The profiler factory: a no-op stand-in when disabled, trace files when enabled."""

import json

import pytest
import torch

from tune.training import DummyProfiler, setup_torch_profiler


def test_disabled_profiler_is_a_no_op():
    profiler = setup_torch_profiler(enabled=False)
    assert isinstance(profiler, DummyProfiler)
    with profiler as prof:
        prof.step()


def test_enabled_profiler_writes_a_trace_for_the_active_steps(tmp_path):
    profiler = setup_torch_profiler(enabled=True, output_dir=tmp_path, wait_steps=1, warmup_steps=1, active_steps=1)
    with profiler:
        for _ in range(3):
            torch.randn(16, 16) @ torch.randn(16, 16)
            profiler.step()
    traces = list(tmp_path.glob("rank0_step*_trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("mm" in event.get("name", "") for event in events)
    assert list(tmp_path.glob("rank0_step*_summary.txt"))


def test_enabled_profiler_needs_an_output_dir():
    with pytest.raises(ValueError, match="output_dir"):
        setup_torch_profiler(enabled=True)
    with pytest.raises(ValueError, match="active_steps>=1"):
        setup_torch_profiler(enabled=True, output_dir="x", active_steps=0)
