"""Each metric logger writes what it should, read back from its own output; only rank 0 writes."""

import importlib.util
import json
import sys

import pytest
import torch

from tune.training.metric_logging import (
    DiskLogger,
    MetricLoggerInterface,
    StdoutLogger,
    TensorBoardLogger,
    WandBLogger,
)

CONFIG = {"model": {"_component_": "tune.models.llama3_2.llama3_2_1b"}, "lr": 3e-4, "layers": [1, 2]}


def _log_two_steps(logger):
    logger.log_config(CONFIG)
    logger.log_dict({"loss": torch.tensor(2.5), "lr": 1e-3}, step=1)
    logger.log("loss", 1.25, step=2)
    logger.close()
    logger.close()  # closing twice is harmless


def test_every_logger_implements_the_interface():
    for cls in (StdoutLogger, DiskLogger, TensorBoardLogger, WandBLogger):
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
