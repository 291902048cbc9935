"""The profiler factory: a no-op stand-in when disabled, trace files when enabled, torchtune's (profiler, settings)
return value and schedule defaults."""

import json

import pytest
import torch

from tune.training import DEFAULT_SCHEDULE, DummyProfiler, setup_torch_profiler


def test_disabled_profiler_is_a_no_op():
    profiler, settings = setup_torch_profiler(enabled=False)
    assert isinstance(profiler, DummyProfiler)
    assert settings == {"enabled": False}
    with profiler as prof:
        prof.step()


def test_enabled_profiler_writes_a_trace_for_the_active_steps(tmp_path):
    profiler, settings = setup_torch_profiler(
        enabled=True, output_dir=tmp_path, wait_steps=1, warmup_steps=1, active_steps=1
    )
    # num_cycles was left out: torchtune's default fills it; the given steps are kept
    assert settings["num_cycles"] == DEFAULT_SCHEDULE["num_cycles"] == 1
    assert (settings["wait_steps"], settings["warmup_steps"], settings["active_steps"]) == (1, 1, 1)
    with profiler:
        for _ in range(3):
            torch.randn(16, 16) @ torch.randn(16, 16)
            profiler.step()
    traces = list(tmp_path.glob("rank0_step*_trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("mm" in event.get("name", "") for event in events)
    assert list(tmp_path.glob("rank0_step*_summary.txt"))


def test_enabled_profiler_defaults_and_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, settings = setup_torch_profiler(enabled=True, profile_memory=True)
    assert settings["output_dir"] == "profiler_output"
    assert {key: settings[key] for key in DEFAULT_SCHEDULE} == {
        "wait_steps": 5,
        "warmup_steps": 5,
        "active_steps": 2,
        "num_cycles": 1,
    }
    assert settings["with_stack"] and settings["record_shapes"]  # torch's memory profile needs both
    with pytest.raises(ValueError, match="active_steps>=1"):
        setup_torch_profiler(enabled=True, output_dir="x", active_steps=0)
