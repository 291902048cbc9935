"""Metric loggers on a full disk (tune/training/metric_logging.py): a write that fails is a MetricLoggerError naming
the file, and what the log held before stays as it was.

A full disk is a real file-size limit (RLIMIT_FSIZE) set part-way, in a child process (so pytest's own files are not
limited): the OS then refuses (EFBIG, "File too large") any write past the limit, as a full disk refuses any write.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tune.training.metric_logging import DiskLogger, MetricLoggerError
from tune.utils import TuneError

ROOT = Path(__file__).resolve().parents[3]

_PRELUDE = """
import json, os, resource, signal, sys
from pathlib import Path
from tune.training.metric_logging import DiskLogger, MetricLoggerError, TensorBoardLogger

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing the process

def fill_disk(limit):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


def _run_child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "OMP_NUM_THREADS": "1"}
    script = _PRELUDE + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_disk_logger_on_a_full_disk_drops_the_part_of_the_line_it_wrote(tmp_path):
    proc = _run_child(
        """
        logger = DiskLogger(log_dir=os.path.abspath("logs"), filename="log.jsonl")
        logger.log_dict({"loss": 2.5}, step=1)
        fill_disk(os.path.getsize("logs/log.jsonl") + 10)  # step 2's line gets 10 bytes in
        try:
            logger.log_dict({"loss": 1.25, "lr": 1e-3}, step=2)
        except MetricLoggerError as error:
            print(error)
        logger.close()
        """,
        tmp_path,
    )
    path = tmp_path / "logs" / "log.jsonl"
    message = proc.stdout.strip()
    assert message.startswith(f"Could not write the metric log {path}: [Errno 27] File too large. ")
    assert "The run stopped at step 2 rather than train on without its metrics" in message
    assert "`metric_logger.log_dir`" in message and "resume_from_checkpoint=True" in message
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1 and path.read_text().endswith("\n")


def test_disk_logger_keeps_the_previous_config_json(tmp_path):
    proc = _run_child(
        """
        logger = DiskLogger(log_dir=os.path.abspath("logs"), filename="log.jsonl")
        logger.log_config({"lr": 1e-3})
        fill_disk(0)
        try:
            logger.log_config({"lr": 2e-3, "epochs": 3})
        except MetricLoggerError as error:
            print(error)
        """,
        tmp_path,
    )
    path = tmp_path / "logs" / "config.json"
    message = proc.stdout.strip()
    assert message.startswith(f"Could not write the metric log's config {path}: [Errno 27] File too large. ")
    assert "The run stopped before training" in message and message.endswith("then run again.")
    assert json.loads(path.read_text()) == {"lr": 1e-3}
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.json", "log.jsonl"]  # no temporary file


def test_disk_logger_that_cannot_create_its_file_names_it(tmp_path):
    (tmp_path / "logs").write_text("a file where the log directory should be")
    with pytest.raises(MetricLoggerError) as info:
        DiskLogger(log_dir=tmp_path / "logs", filename="log.jsonl")
    assert isinstance(info.value, TuneError)  # printed by the CLI as one error line
    assert str(info.value).startswith(f"Could not write the metric log {tmp_path / 'logs' / 'log.jsonl'}: ")
    assert "File exists" in str(info.value)


def test_tensorboard_logger_on_a_full_disk_stops_at_the_step_without_a_traceback(tmp_path):
    pytest.importorskip("tensorboard")
    proc = _run_child(
        """
        logger = TensorBoardLogger(log_dir=os.path.abspath("tb"), organize_logs=False)
        logger.log_dict({"loss": 2.5}, step=1)
        fill_disk(1)
        try:
            logger.log_dict({"loss": 1.25}, step=2)
        except MetricLoggerError as error:
            print(error)
        logger.close()  # the failure was reported: closing says nothing more
        logger.close()
        """,
        tmp_path,
    )
    message = proc.stdout.strip()
    assert message.startswith(
        f"Could not write the TensorBoard event file in {tmp_path / 'tb'}: [Errno 27] File too large."
    )
    assert "The run stopped at step 2" in message
    # TensorBoard's writer thread fails first: its traceback is left out, the logger reports the error
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr
