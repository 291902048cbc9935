"""Components ``gpu_check.py`` names in the configs it writes (``benchmarks/`` is on the runs' PYTHONPATH).

``TimedLogger``, the metric logger both systems' recipes get: one JSON line per logged step.

Each line holds the step, the wall time right after the step's work finished on the device (the logger
synchronises first, so queued kernels count in the step that launched them), the recipe's own metrics, and the
process's peak allocated and reserved CUDA memory so far. After ``stop_after`` steps it ends the process: the
recipes would otherwise spend minutes writing an 8B checkpoint that the benchmark does not measure.

Both torchtune's and tune's recipes call ``log_config``, ``log_dict``, ``log`` and ``close``; nothing else.

``dense_attention_model``, a tune model whose packed batches take the dense masked SDPA call instead of flex
attention: the check's fallback when a tune run with flex attention fails.
"""

import importlib
import json
import os
import time
from pathlib import Path

import torch


class TimedLogger:
    """Writes ``log_dir/steps.jsonl``; exits the process after step ``stop_after`` (None: never)."""

    def __init__(self, log_dir: str, stop_after: int | None = None, **kwargs) -> None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._file = open(Path(log_dir) / "steps.jsonl", "a")
        self._stop_after = stop_after

    def log_config(self, config) -> None:
        pass

    def log(self, name: str, data, step: int) -> None:
        self.log_dict({name: data}, step)

    def log_dict(self, payload: dict, step: int) -> None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        record = {"step": step, "time": time.time()}
        for key, value in payload.items():
            record[key] = value.item() if isinstance(value, torch.Tensor) else value
        if cuda:
            record["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
            record["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        if self._stop_after is not None and step >= self._stop_after:
            self._file.close()
            os._exit(0)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def dense_attention_model(builder: str, **kwargs):
    """``builder(**kwargs)`` (a dotted path to a tune model builder) with ``use_flex_attention = False``."""
    module, name = builder.rsplit(".", 1)
    model = getattr(importlib.import_module(module), name)(**kwargs)
    model.use_flex_attention = False
    return model
