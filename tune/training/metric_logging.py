"""Metric loggers with one interface: stdout, JSONL on disk, TensorBoard, Weights & Biases.

Every logger writes on rank 0 only; on other ranks each method is a no-op, so a distributed recipe calls them
unconditionally. Values may be Python numbers or 0-d tensors (read with ``.item()``: call at logging steps only,
since that synchronises with the device).
"""

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

import torch

from tune.utils import get_rank, import_optional

__all__ = ["DiskLogger", "MetricLoggerInterface", "StdoutLogger", "TensorBoardLogger", "WandBLogger"]

Scalar = int | float | torch.Tensor


@runtime_checkable
class MetricLoggerInterface(Protocol):
    """What a recipe calls on a metric logger; a user's own class only needs these four methods."""

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Logs one scalar ``name`` at ``step``."""

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Logs several scalars at ``step``."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Records the resolved run configuration (a mapping, e.g. ``OmegaConf.to_container(cfg)``)."""

    def close(self) -> None:
        """Flushes and releases files or connections. Safe to call twice."""


def _scalar(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.item()
    return value


def _plain(config: Any) -> Any:
    """Nested mappings and sequences (OmegaConf containers included) as dicts and lists of plain values."""
    if isinstance(config, Mapping):
        return {str(key): _plain(value) for key, value in config.items()}
    if isinstance(config, Sequence) and not isinstance(config, (str, bytes)):
        return [_plain(value) for value in config]
    if isinstance(config, (int, float, str, bool)) or config is None:
        return config
    return str(config)


def _check_config(config: Any) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(
            f"log_config expects a mapping of config keys to values; received {type(config).__name__}. "
            "Pass `OmegaConf.to_container(cfg, resolve=True)` or a dict."
        )
    return _plain(config)


class StdoutLogger:
    """Prints ``Step N | name:value ...`` lines to stdout (rank 0 only)."""

    def __init__(self, **kwargs: Any) -> None:
        # kwargs accepted (and ignored) so configs can switch loggers by changing only `_component_`
        self._enabled = get_rank() == 0

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Prints one scalar. See :class:`MetricLoggerInterface`."""
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Prints several scalars on one line. See :class:`MetricLoggerInterface`."""
        if not self._enabled:
            return
        fields = " ".join(f"{name}:{_format(_scalar(value))}" for name, value in payload.items())
        print(f"Step {step} | {fields}", file=sys.stdout, flush=True)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Prints the config as JSON. See :class:`MetricLoggerInterface`."""
        plain = _check_config(config)
        if self._enabled:
            print("Config: " + json.dumps(plain, sort_keys=True), file=sys.stdout, flush=True)

    def close(self) -> None:
        """Flushes stdout."""
        sys.stdout.flush()


def _format(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class DiskLogger:
    """Appends one JSON object per ``log_dict`` call to ``log_dir/filename`` (JSON Lines).

    Each line is ``{"step": N, "time": <unix seconds>, name: value, ...}``: the wall-clock time makes step
    durations and throughput recoverable from the file alone. ``log_config`` writes ``config.json`` beside it.

    Args:
        log_dir (str | Path): directory for the log; created if missing.
        filename (str | None): file name; default ``log_<unix time>.jsonl``.
        **kwargs: ignored, so configs can switch loggers by changing only ``_component_``.
    """

    def __init__(self, log_dir: str | Path, filename: str | None = None, **kwargs: Any) -> None:
        self.log_dir = Path(log_dir)
        self.path = self.log_dir / (filename or f"log_{int(time.time())}.jsonl")
        self._file: TextIO | None = None
        if get_rank() == 0:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Writes one scalar as its own line. See :class:`MetricLoggerInterface`."""
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Writes one line for this step. See :class:`MetricLoggerInterface`."""
        if self._file is None:
            return
        record = {"step": int(step), "time": time.time()}
        record.update({name: _scalar(value) for name, value in payload.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Writes ``config.json`` next to the log. See :class:`MetricLoggerInterface`."""
        plain = _check_config(config)
        if self._file is not None:
            (self.log_dir / "config.json").write_text(json.dumps(plain, indent=2, sort_keys=True), encoding="utf-8")

    def close(self) -> None:
        """Closes the file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()


class TensorBoardLogger:
    """Writes scalars as TensorBoard events with ``torch.utils.tensorboard``.

    Needs the ``tensorboard`` package (``pip install 'tune[tensorboard]'``), imported when the logger is built.

    Args:
        log_dir (str | Path): root directory of the event files.
        organize_logs (bool): write into ``log_dir/run_<rank>_<unix time>`` so runs sharing a ``log_dir`` show
            up separately in TensorBoard; ``False`` writes into ``log_dir`` itself.
        **kwargs: passed to ``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        ImportError: when ``tensorboard`` is not installed; the message names the extra to install.
    """

    def __init__(self, log_dir: str | Path, organize_logs: bool = True, **kwargs: Any) -> None:
        import_optional("tensorboard", "TensorBoardLogger")  # names the extra when missing
        tensorboard = import_optional("torch.utils.tensorboard", "TensorBoardLogger")
        self.log_dir = Path(log_dir) / f"run_{get_rank()}_{int(time.time())}" if organize_logs else Path(log_dir)
        self._writer = None
        if get_rank() == 0:
            self._writer = tensorboard.SummaryWriter(log_dir=str(self.log_dir), **kwargs)

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Adds one scalar. See :class:`MetricLoggerInterface`."""
        if self._writer is not None:
            self._writer.add_scalar(name, _scalar(data), global_step=step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Adds several scalars. See :class:`MetricLoggerInterface`."""
        for name, value in payload.items():
            self.log(name, value, step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Adds the config as a text summary named ``config``. See :class:`MetricLoggerInterface`."""
        plain = _check_config(config)
        if self._writer is not None:
            # indented by 4 spaces so TensorBoard's markdown renders it as a code block
            text = "\n".join("    " + line for line in json.dumps(plain, indent=2, sort_keys=True).splitlines())
            self._writer.add_text("config", text)

    def close(self) -> None:
        """Flushes and closes the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandBLogger:
    """Logs to Weights & Biases. ``mode="offline"`` records the run locally with no network.

    Needs the ``wandb`` package (``pip install 'tune[wandb]'``), imported when the logger is built. Offline runs
    land in ``log_dir/wandb/offline-run-*``; upload them later with ``wandb sync``.

    Args:
        project (str): W&B project name.
        entity (str | None): W&B user or team.
        group (str | None): run group.
        log_dir (str | Path | None): local directory for W&B files (default: W&B's own, ``./wandb``).
        mode (str | None): ``"online"``, ``"offline"`` or ``"disabled"``; ``None`` lets W&B decide
            (``WANDB_MODE``, login state).
        **kwargs: passed to ``wandb.init`` (``name``, ``tags``, ...).

    Raises:
        ImportError: when ``wandb`` is not installed; the message names the extra to install.
        ValueError: for an unknown ``mode``.
    """

    def __init__(
        self,
        project: str = "tune",
        entity: str | None = None,
        group: str | None = None,
        log_dir: str | Path | None = None,
        mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"mode must be 'online', 'offline', 'disabled' or None; received {mode!r}.")
        wandb = import_optional("wandb", "WandBLogger")
        self._run = None
        if get_rank() == 0:
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
            init_args = dict(project=project, entity=entity, group=group, mode=mode, **kwargs)
            if log_dir is not None:
                init_args["dir"] = str(log_dir)
            self._run = wandb.run if wandb.run is not None else wandb.init(**init_args)

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Logs one scalar. See :class:`MetricLoggerInterface`."""
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Logs several scalars at ``step``. See :class:`MetricLoggerInterface`."""
        if self._run is not None:
            self._run.log({name: _scalar(value) for name, value in payload.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Stores the config as the run's W&B config. See :class:`MetricLoggerInterface`."""
        plain = _check_config(config)
        if self._run is not None:
            self._run.config.update(plain, allow_val_change=True)

    def close(self) -> None:
        """Finishes the W&B run."""
        if self._run is not None:
            self._run.finish()
            self._run = None
