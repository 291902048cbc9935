"""Each metric logger writes what it should, read back from its own output; only rank 0 writes."""

import importlib.util
import json
import sys
import types

import pytest
import torch

from tune.training.metric_logging import (
    CometLogger,
    DiskLogger,
    MetricLoggerInterface,
    MLFlowLogger,
    StdoutLogger,
    TensorBoardLogger,
    WandBLogger,
    flatten_dict,
)

CONFIG = {"model": {"_component_": "tune.models.llama3_2.llama3_2_1b"}, "lr": 3e-4, "layers": [1, 2]}


def _log_two_steps(logger):
    logger.log_config(CONFIG)
    logger.log_dict({"loss": torch.tensor(2.5), "lr": 1e-3}, step=1)
    logger.log("loss", 1.25, step=2)
    logger.close()
    logger.close()  # closing twice is harmless


def test_every_logger_implements_the_interface():
    for cls in (StdoutLogger, DiskLogger, TensorBoardLogger, WandBLogger, CometLogger, MLFlowLogger):
        assert all(callable(getattr(cls, name, None)) for name in ("log", "log_dict", "log_config", "close"))
    assert isinstance(StdoutLogger(), MetricLoggerInterface)


def test_stdout_logger_prints_steps(capsys):
    _log_two_steps(StdoutLogger())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Config: ") and json.loads(lines[0][len("Config: ") :]) == CONFIG
    assert lines[1:] == ["Step 1 | loss:2.5 lr:0.001", "Step 2 | loss:1.25"]


def test_disk_logger_writes_one_json_line_per_call_with_wall_time(tmp_path):
    logger = DiskLogger(log_dir=tmp_path / "logs", filename="log.jsonl")
    _log_two_steps(logger)
    records = [json.loads(line) for line in (tmp_path / "logs" / "log.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in records] == [
        {"step": 1, "loss": 2.5, "lr": 1e-3},
        {"step": 2, "loss": 1.25},
    ]
    assert records[0]["time"] <= records[1]["time"]
    assert json.loads((tmp_path / "logs" / "config.json").read_text()) == CONFIG


def test_loggers_write_nothing_on_other_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    _log_two_steps(DiskLogger(log_dir=tmp_path / "disk"))
    _log_two_steps(TensorBoardLogger(log_dir=tmp_path / "tb"))
    _log_two_steps(StdoutLogger())
    assert not (tmp_path / "disk").exists() and not (tmp_path / "tb").exists()
    assert capsys.readouterr().out == ""


def test_log_config_refuses_a_non_mapping(tmp_path):
    with pytest.raises(TypeError, match="OmegaConf.to_container"):
        DiskLogger(log_dir=tmp_path).log_config(["not", "a", "mapping"])


def test_tensorboard_logger_writes_scalars_and_config(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(log_dir=tmp_path)
    run_dir = logger.log_dir
    _log_two_steps(logger)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("loss")]
    assert loss == [(1, 2.5), (2, 1.25)]
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("lr")] == [(1, 1e-3)]
    assert "config/text_summary" in events.Tags()["tensors"]


def _hide_module(monkeypatch, name):
    # a None entry in sys.modules makes every import of `name` raise ImportError, as if it were not installed
    monkeypatch.setitem(sys.modules, name, None)


def test_tensorboard_missing_names_the_extra(tmp_path, monkeypatch):
    _hide_module(monkeypatch, "tensorboard")
    with pytest.raises(ImportError, match=r"tune\[tensorboard\]"):
        TensorBoardLogger(log_dir=tmp_path)


def test_wandb_missing_names_the_extra(tmp_path, monkeypatch):
    _hide_module(monkeypatch, "wandb")
    with pytest.raises(ImportError, match=r"tune\[wandb\]"):
        WandBLogger(log_dir=tmp_path, mode="offline")


def test_wandb_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="offline"):
        WandBLogger(mode="airplane")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb (the tune[wandb] extra) not installed")
def test_wandb_offline_run_records_locally(tmp_path, monkeypatch):
    # mode=None defers to WANDB_MODE; WANDB_DIR keeps the run inside tmp_path
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandBLogger(project="tune-test")
    _log_two_steps(logger)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))

    # read the run's transaction log back with W&B's own reader (`wandb leet inspect --json`, one record a line)
    import subprocess
    from pathlib import Path

    wandb_cli = Path(sys.executable).parent / "wandb"
    proc = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(runs[0])], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    history = [r["history"] for r in records if r["type"] == "history"]
    logged = [{k: v for k, v in h["item"].items() if not k.startswith("_")} for h in history]
    assert [h["step"]["num"] for h in history] == [1, 2]
    assert logged == [{"loss": 2.5, "lr": 1e-3}, {"loss": 1.25}]  # the tensor was logged as its number
    config_updates = {}
    for r in records:
        if r["type"] == "config":
            config_updates.update(r["config"]["update"])
    assert {k: config_updates[k] for k in CONFIG} == CONFIG


class _Recorder:
    """Stands in for an optional logging package (comet_ml, mlflow): records every call made to it."""

    def __init__(self, calls, prefix=""):
        self._calls, self._prefix = calls, prefix

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self._calls.append((self._prefix + name, args, kwargs))

        return call


def _comet_stand_in(monkeypatch, calls):
    module = types.ModuleType("comet_ml")
    module.ExperimentConfig = lambda **kwargs: ("ExperimentConfig", kwargs)
    module.start = lambda **kwargs: calls.append(("start", (), kwargs)) or _Recorder(calls, "experiment.")
    monkeypatch.setitem(sys.modules, "comet_ml", module)


def test_comet_logger_logs_metrics_config_and_ends(tmp_path, monkeypatch):
    calls = []
    _comet_stand_in(monkeypatch, calls)
    logger = CometLogger(project="p", experiment_name="run", tags=["a"], log_dir="ignored")
    logger.log_config({**CONFIG, "output_dir": str(tmp_path)})
    logger.log_dict({"loss": torch.tensor(2.5), "lr": 1e-3}, step=1)
    logger.log("loss", 1.25, step=2)
    logger.close()
    logger.close()
    names = [name for name, _, _ in calls]
    assert names == [
        "start",
        "experiment.log_parameters",
        "experiment.log_asset",
        "experiment.log_metrics",
        "experiment.log_metric",
        "experiment.end",
    ]
    start = calls[0][2]
    assert start["project"] == "p"
    assert start["experiment_config"] == ("ExperimentConfig", {"log_code": True, "tags": ["a"], "name": "run"})
    assert calls[1][1][0]["model"] == CONFIG["model"]
    assert (tmp_path / "config.yaml").is_file() and calls[2][1][0] == str(tmp_path / "config.yaml")
    assert calls[3][1:] == (({"loss": 2.5, "lr": 1e-3},), {"step": 1})  # tensors read as numbers
    assert calls[4][1:] == (("loss", 1.25), {"step": 2})


def test_comet_logger_does_nothing_on_other_ranks(monkeypatch):
    calls = []
    _comet_stand_in(monkeypatch, calls)
    monkeypatch.setenv("RANK", "1")
    logger = CometLogger()
    logger.log("loss", 1.0, step=1)
    logger.close()
    assert calls == []


def test_mlflow_logger_starts_a_run_logs_flat_params_and_ends_it(tmp_path, monkeypatch):
    calls = []
    state = {"active": None}
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
    module = types.ModuleType("mlflow")
    recorder = _Recorder(calls)
    for name in ("set_tracking_uri", "set_experiment", "log_metric", "log_metrics", "log_params", "log_artifact"):
        setattr(module, name, getattr(recorder, name))
    module.is_tracking_uri_set = lambda: False
    module.active_run = lambda: state["active"]
    module.start_run = lambda **kwargs: calls.append(("start_run", (), kwargs)) or state.update(active=run) or run
    module.end_run = lambda: calls.append(("end_run", (), {})) or state.update(active=None)
    monkeypatch.setitem(sys.modules, "mlflow", module)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)

    logger = MLFlowLogger(experiment_name="exp", tracking_uri=str(tmp_path / "mlruns"), run_name="first")
    logger.log_config({**CONFIG, "output_dir": str(tmp_path)})
    logger.log_dict({"loss": torch.tensor(2.5)}, step=1)
    logger.log("lr", 1e-3, step=1)
    logger.close()
    names = [name for name, _, _ in calls]
    assert names == [
        "set_tracking_uri",
        "set_experiment",
        "start_run",
        "log_params",
        "log_artifact",
        "log_metrics",
        "log_metric",
        "end_run",
    ]
    assert calls[2][2] == {"run_id": None, "run_name": "first"}
    assert calls[3][1][0]["model._component_"] == CONFIG["model"]["_component_"]  # nested keys joined with "."
    assert calls[5][1:] == (({"loss": 2.5},), {"step": 1, "run_id": "r1"})
    logger.log("lr", 1e-3, step=2)  # after close: no active run, nothing logged
    assert len(calls) == 8


def test_comet_and_mlflow_missing_name_their_extras(monkeypatch):
    _hide_module(monkeypatch, "comet_ml")
    _hide_module(monkeypatch, "mlflow")
    with pytest.raises(ImportError, match=r"tune\[comet\]"):
        CometLogger()
    with pytest.raises(ImportError, match=r"tune\[mlflow\]"):
        MLFlowLogger()


def test_flatten_dict():
    assert flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": [{"f": 3}]}, sep="/") == {
        "a/b": 1,
        "a/c/d": 2,
        "e": [{"f": 3}],
    }
