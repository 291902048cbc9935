"""Metric loggers with one interface: stdout, JSONL on disk, TensorBoard, Weights & Biases, Comet, MLflow.

Every logger writes on rank 0 only; on other ranks each method is a no-op, so a distributed recipe calls them
unconditionally. Values may be Python numbers or 0-d tensors (read with ``.item()``: call at logging steps only,
since that synchronises with the device).

A logger that cannot write its files (a full disk) raises :class:`MetricLoggerError`, which stops the run: training
on without its metrics would lose them silently.
"""

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import torch

from tune.utils import TuneError, get_logger, get_rank, import_optional

__all__ = [
    "CometLogger",
    "DiskLogger",
    "MLFlowLogger",
    "MetricLoggerError",
    "MetricLoggerInterface",
    "StdoutLogger",
    "TensorBoardLogger",
    "WandBLogger",
    "flatten_dict",
    "save_config",
]

log = get_logger(name=__name__)

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


class MetricLoggerError(TuneError, OSError):
    """A metric logger could not write its files (a full disk, a file-size limit, no permission); the message names
    the file. The CLI prints it as one ``error:`` line."""


def _write_error(what: str, error: OSError, step: int | None = None) -> MetricLoggerError:
    # what: "the metric log PATH"; step: the step being logged (None while the logger is set up, before training)
    reason = error.__cause__ if isinstance(error.__cause__, OSError) else error
    if step is None:
        stopped, then = "The run stopped before training", "run again"
    else:
        stopped = f"The run stopped at step {step} rather than train on without its metrics"
        then = "resume with `resume_from_checkpoint=True`"
    return MetricLoggerError(
        f"Could not write {what}: {reason}. {stopped}; the log keeps the records written before, and the "
        "checkpoints saved so far are complete (each is published whole). Free disk space or raise the file-size "
        f"limit (`ulimit -f`), or set `metric_logger.log_dir` to another disk, then {then}."
    )


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
    Each line reaches the file as the call returns; a line that cannot be written whole (a full disk) is removed
    again, so the file stays valid JSON Lines and a resumed run appends to it.

    Args:
        log_dir (str | Path): directory for the log; created if missing.
        filename (str | None): file name; default ``log_<unix time>.jsonl``.
        **kwargs: ignored, so configs can switch loggers by changing only ``_component_``.

    Raises:
        MetricLoggerError: when the directory or the file cannot be created, naming the file.
    """

    def __init__(self, log_dir: str | Path, filename: str | None = None, **kwargs: Any) -> None:
        self.log_dir = Path(log_dir)
        self.path = self.log_dir / (filename or f"log_{int(time.time())}.jsonl")
        self._file: BinaryIO | None = None
        if get_rank() == 0:
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                # unbuffered: a write fails in the call that makes it, never later when a buffer is flushed
                self._file = open(self.path, "ab", buffering=0)
            except OSError as error:
                raise _write_error(f"the metric log {self.path}", error) from error

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Writes one scalar as its own line. See :class:`MetricLoggerInterface`."""
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Writes one line for this step. See :class:`MetricLoggerInterface`.

        Raises:
            MetricLoggerError: when the line cannot be written (a full disk), naming the file; the part of the
                line that was written is removed.
        """
        if self._file is None:
            return
        record = {"step": int(step), "time": time.time()}
        record.update({name: _scalar(value) for name, value in payload.items()})
        line = (json.dumps(record) + "\n").encode("utf-8")
        end = self._file.seek(0, os.SEEK_END)
        try:
            written = 0
            while written < len(line):  # an unbuffered file may take part of the bytes per call
                written += self._file.write(line[written:])
        except OSError as error:
            with contextlib.suppress(OSError):
                self._file.truncate(end)  # shrinking a file needs no space
            raise _write_error(f"the metric log {self.path}", error, step) from error

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Writes ``config.json`` next to the log, atomically. See :class:`MetricLoggerInterface`.

        Raises:
            MetricLoggerError: when the file cannot be written, naming it; a ``config.json`` already there is left
                as it was.
        """
        plain = _check_config(config)
        if self._file is None:
            return
        from tune.training.checkpointing._state import write_text_atomically  # checkpointing loads lazily

        path = self.log_dir / "config.json"
        try:
            write_text_atomically(json.dumps(plain, indent=2, sort_keys=True), path)
        except OSError as error:
            raise _write_error(f"the metric log's config {path}", error) from error

    def close(self) -> None:
        """Closes the file."""
        if getattr(self, "_file", None) is not None:  # None also when __init__ failed
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()


class TensorBoardLogger:
    """Writes scalars as TensorBoard events with ``torch.utils.tensorboard``.

    Needs the ``tensorboard`` package (``pip install 'tune[tensorboard]'``), imported when the logger is built.
    Each call's events are flushed to the event file before it returns, so a failed write stops the run at the step
    it belongs to.

    Args:
        log_dir (str | Path): root directory of the event files.
        organize_logs (bool): write into ``log_dir/run_<rank>_<unix time>`` so runs sharing a ``log_dir`` show
            up separately in TensorBoard; ``False`` writes into ``log_dir`` itself.
        **kwargs: passed to ``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        ImportError: when ``tensorboard`` is not installed; the message names the extra to install.
        MetricLoggerError: when the event file cannot be created, naming its directory.
    """

    def __init__(self, log_dir: str | Path, organize_logs: bool = True, **kwargs: Any) -> None:
        import_optional("tensorboard", "TensorBoardLogger")  # names the extra when missing
        tensorboard = import_optional("torch.utils.tensorboard", "TensorBoardLogger")
        self.log_dir = Path(log_dir) / f"run_{get_rank()}_{int(time.time())}" if organize_logs else Path(log_dir)
        self._writer = None
        self._failed = False
        if get_rank() == 0:
            _quiet_tensorboard_writer_thread()
            try:
                self._writer = tensorboard.SummaryWriter(log_dir=str(self.log_dir), **kwargs)
            except OSError as error:
                raise _write_error(f"the TensorBoard event file in {self.log_dir}", error) from error

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Adds one scalar. See :class:`MetricLoggerInterface`."""
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Adds several scalars. See :class:`MetricLoggerInterface`.

        Raises:
            MetricLoggerError: when the event file cannot be written (a full disk), naming its directory.
        """
        if self._writer is None:
            return
        with self._writing(step):
            for name, value in payload.items():
                self._writer.add_scalar(name, _scalar(value), global_step=step)
            self._writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Adds the config as a text summary named ``config``. See :class:`MetricLoggerInterface`."""
        plain = _check_config(config)
        if self._writer is None:
            return
        # indented by 4 spaces so TensorBoard's markdown renders it as a code block
        text = "\n".join("    " + line for line in json.dumps(plain, indent=2, sort_keys=True).splitlines())
        with self._writing(None):
            self._writer.add_text("config", text)
            self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file.

        Raises:
            MetricLoggerError: when the last events cannot be written, unless an error is already on its way (a
                failed write reported before, or another error stopping the run: that one is reported instead).
        """
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            writer.close()
        except OSError as error:
            if self._failed:
                return  # reported by the call that failed
            failure = _write_error(f"the TensorBoard event file in {self.log_dir}", error)
            if sys.exc_info()[1] is not None:  # called while another error stops the run: that one is the message
                log.warning(str(failure))
                return
            raise failure from error

    @contextlib.contextmanager
    def _writing(self, step: int | None):
        try:
            yield
        except OSError as error:
            self._failed = True
            raise _write_error(f"the TensorBoard event file in {self.log_dir}", error, step) from error


def _quiet_tensorboard_writer_thread() -> None:
    # TensorBoard writes events from a thread of its own, which re-raises a failed write (a full disk), so Python
    # prints its traceback, and keeps the error for the writer's next call: there TensorBoardLogger reports it as one
    # MetricLoggerError line. Leave out the thread's traceback (an OSError of that thread only); the rest goes to
    # the hook there was.
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard_writer", False):
        return

    def excepthook(args: threading.ExceptHookArgs) -> None:
        writer_thread = type(args.thread).__module__.startswith("tensorboard.summary.writer")
        if not (writer_thread and isinstance(args.exc_value, OSError)):
            previous(args)

    excepthook.quiets_tensorboard_writer = True
    threading.excepthook = excepthook


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


def flatten_dict(d: Mapping[str, Any], *, sep: str = ".", parent_key: str = "") -> dict[str, Any]:
    """Nested mappings as one level, keys joined with ``sep``: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``.

    Mappings inside lists are left as they are.

    Args:
        d (Mapping[str, Any]): the nested mapping.
        sep (str): the separator between a parent key and a child key. Default ``"."``.
        parent_key (str): a prefix for every key. Default ``""``.

    Returns:
        dict[str, Any]: the flat dict.
    """
    flat: dict[str, Any] = {}
    for key, value in d.items():
        full_key = f"{parent_key}{sep}{key}" if parent_key else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_dict(value, sep=sep, parent_key=full_key))
        else:
            flat[full_key] = value
    return flat


def save_config(config: Mapping[str, Any]) -> Path | None:
    """Writes the resolved config as ``config.yaml`` in its own ``output_dir`` (created if needed).

    Used by loggers that upload the config file; a failure is logged as a warning, not raised, so logging
    never stops a run.

    Args:
        config (Mapping[str, Any]): the config (a dict or a ``DictConfig``) with an ``output_dir`` key.

    Returns:
        Path | None: the file written, or None when it could not be written.
    """
    from tune.training.checkpointing._state import save_config as write_config

    try:
        output_dir = Path(config["output_dir"])
        output_dir.mkdir(parents=True, exist_ok=True)
        return write_config(config, output_dir)
    except (KeyError, TypeError, OSError) as err:
        log.warning(f"Could not save the config next to the metrics: {type(err).__name__}: {err}")
        return None


class CometLogger:
    """Logs to Comet (https://www.comet.com), on rank 0 only.

    Needs the ``comet_ml`` package (``pip install 'tune[comet]'``), imported when the logger is built. The API key
    and workspace may also come from Comet's own configuration (``COMET_API_KEY``, ``~/.comet.config``).

    Args:
        api_key (str | None): Comet API key. Default None (Comet's configuration).
        workspace (str | None): Comet workspace. Default None.
        project (str | None): Comet project. Default None.
        experiment_key (str | None): key of an existing experiment to continue. Default None (a new one).
        mode (str | None): ``"create"``, ``"get"`` or ``"get_or_create"``; None lets Comet decide.
        online (bool | None): False records the experiment locally for a later upload. Default None.
        experiment_name (str | None): the experiment's display name. Default None.
        tags (list[str] | None): tags for the experiment. Default None.
        log_code (bool): upload the calling script's source. Default True.
        **kwargs: passed to ``comet_ml.ExperimentConfig`` (``log_dir`` from recipe configs is dropped).

    Raises:
        ImportError: when ``comet_ml`` is not installed; the message names the extra to install.
    """

    def __init__(
        self,
        api_key: str | None = None,
        workspace: str | None = None,
        project: str | None = None,
        experiment_key: str | None = None,
        mode: str | None = None,
        online: bool | None = None,
        experiment_name: str | None = None,
        tags: list[str] | None = None,
        log_code: bool = True,
        **kwargs: Any,
    ) -> None:
        comet_ml = import_optional("comet_ml", "CometLogger")
        kwargs.pop("log_dir", None)  # recipes pass log_dir to every logger; Comet keeps its own files
        self.experiment = None
        if get_rank() == 0:
            settings = comet_ml.ExperimentConfig(log_code=log_code, tags=tags, name=experiment_name, **kwargs)
            self.experiment = comet_ml.start(
                api_key=api_key,
                workspace=workspace,
                project=project,
                experiment_key=experiment_key,
                mode=mode,
                online=online,
                experiment_config=settings,
            )

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Logs one scalar. See :class:`MetricLoggerInterface`."""
        if self.experiment is not None:
            self.experiment.log_metric(name, _scalar(data), step=step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Logs several scalars at ``step``. See :class:`MetricLoggerInterface`."""
        if self.experiment is not None:
            self.experiment.log_metrics({name: _scalar(value) for name, value in payload.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Records the config as the experiment's parameters and uploads it as ``config.yaml``."""
        plain = _check_config(config)
        if self.experiment is None:
            return
        self.experiment.log_parameters(plain)
        path = save_config(plain)
        if path is not None:
            self.experiment.log_asset(str(path), file_name=path.name)

    def close(self) -> None:
        """Ends the Comet experiment."""
        if self.experiment is not None:
            self.experiment.end()
            self.experiment = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class MLFlowLogger:
    """Logs to MLflow (https://mlflow.org), on rank 0 only.

    Needs the ``mlflow`` package (``pip install 'tune[mlflow]'``), imported when the logger is built. Starts a run
    unless one is active (an ``mlflow.start_run`` block around the recipe, say), in which case it logs there.

    Args:
        experiment_name (str | None): the MLflow experiment. Default ``MLFLOW_EXPERIMENT_NAME``, else MLflow's
            default experiment.
        tracking_uri (str | None): the tracking server or directory. Default ``MLFLOW_TRACKING_URI``, else
            MLflow's default (``./mlruns``).
        run_id (str | None): an existing run to continue. Default ``MLFLOW_RUN_ID``, else a new run.
        run_name (str | None): the new run's name. Default None (MLflow picks one).

    Raises:
        ImportError: when ``mlflow`` is not installed; the message names the extra to install.
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        run_name: str | None = None,
    ) -> None:
        self._mlflow = import_optional("mlflow", "MLFlowLogger")
        self._rank = get_rank()
        self._tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self._experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        self._run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
        self._started = False
        if self._rank != 0:
            return
        if self._tracking_uri is not None and not self._mlflow.is_tracking_uri_set():
            self._mlflow.set_tracking_uri(self._tracking_uri)
        active = self._mlflow.active_run()
        if active is not None and self._run_id is None:
            self._run_id = active.info.run_id  # log into the caller's run
            return
        if self._experiment_name is not None:
            self._mlflow.set_experiment(self._experiment_name)
        run = self._mlflow.start_run(run_id=self._run_id, run_name=run_name)
        self._run_id = run.info.run_id
        self._started = True

    def _active(self) -> bool:
        return self._rank == 0 and self._mlflow.active_run() is not None

    def log(self, name: str, data: Scalar, step: int) -> None:
        """Logs one scalar. See :class:`MetricLoggerInterface`."""
        if self._active():
            self._mlflow.log_metric(name, _scalar(data), step=step, run_id=self._run_id)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        """Logs several scalars at ``step``. See :class:`MetricLoggerInterface`."""
        if self._active():
            metrics = {name: _scalar(value) for name, value in payload.items()}
            self._mlflow.log_metrics(metrics, step=step, run_id=self._run_id)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Records the config as the run's parameters (nested keys joined with ``.``) and uploads ``config.yaml``."""
        plain = _check_config(config)
        if not self._active():
            return
        self._mlflow.log_params(flatten_dict(plain), run_id=self._run_id)
        path = save_config(plain)
        if path is not None:
            # an absolute output_dir becomes a relative artifact path inside the run
            self._mlflow.log_artifact(str(path), artifact_path=str(path.parent).lstrip("/"), run_id=self._run_id)

    def close(self) -> None:
        """Ends the run this logger started (a run the caller started is left to the caller)."""
        if self._started and self._mlflow.active_run() is not None:
            self._mlflow.end_run()
        self._started = False

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
