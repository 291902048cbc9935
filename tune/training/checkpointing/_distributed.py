"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP) for FSDP2 runs, and full-state gathering.

Each rank writes its own shards of the model and optimizer in parallel; the checkpoint is published (renamed from
its temporary directory, with the ``.complete`` marker) by rank 0 after every rank finished. Loading reads
non-tensor values with ``torch.load(weights_only=True)`` rather than DCP's default unrestricted unpickling.
"""

import io
import pickle
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tune.training.checkpointing._io import CheckpointSaveError, describe_dir
from tune.training.checkpointing._layout import (
    _save_failed_message,
    checkpoint_dir_name,
    find_latest_checkpoint,
    prune_checkpoints,
    publish_checkpoint,
    remove_stale_temporaries,
    temporary_dir_for,
)
from tune.training.checkpointing._state import save_config
from tune.utils import get_logger, get_rank

log = get_logger(name=__name__)

_FORMAT = "dcp"


def _weights_only_load_planner() -> Any:
    # Built on first use: importing torch.distributed.checkpoint costs seconds, which `import tune` should not pay.
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._nested_dict import set_element

    class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
        # DCP's default planner unpickles non-tensor values without restriction; allow tensors and containers.
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as error:
                raise ValueError(
                    f"Refused to load {read_item.dest_index.fqn!r}: it holds objects other than tensors and plain "
                    "containers, and tune never unpickles arbitrary objects."
                ) from error
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _WeightsOnlyLoadPlanner()


def _barrier(group: dist.ProcessGroup | None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _group_rank(group: dist.ProcessGroup | None) -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return get_rank()


def _empty_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _publish(temp_dir: Path, final: Path, marker: dict[str, Any], config: Mapping[str, Any] | str | None) -> None:
    if config is not None:
        save_config(config, temp_dir)
    publish_checkpoint(temp_dir, final, marker)
    log.info(f"Saved distributed checkpoint to {final}.")


def _write_failure(error: BaseException) -> OSError | None:
    # the failed writes of a DCP CheckpointException (rank -> (exception, stack)) as one OSError naming the ranks;
    # None when a rank failed otherwise (a bug, say)
    failures = {rank: exc for rank, (exc, _) in sorted(error.failures.items())}
    if not failures or not all(isinstance(exc, OSError) for exc in failures.values()):
        return None
    return OSError("; ".join(f"rank {rank}: {exc}" for rank, exc in failures.items()))


class DistributedCheckpointer:
    """Saves and resumes sharded training state (FSDP2 model and optimizer, progress) with DCP.

    Every rank calls :meth:`save_checkpoint` and :meth:`load_checkpoint` with its own (sharded) state dict, e.g.
    ``{"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt), "steps_run": 10}``.
    Checkpoints use the same layout and atomic publication as the other checkpointers
    (``output_dir/step_N/`` with a ``.complete`` marker). For Hugging Face or PEFT outputs, gather the full
    state dict with :func:`gather_full_state_dict` and save it with :class:`FullModelHFCheckpointer` on rank 0.

    Args:
        checkpoint_dir (str | Path | None): the base model's directory (only checked not to contain output_dir).
        output_dir (str | Path): where ``step_N/`` checkpoints go.
        process_group (dist.ProcessGroup | None): the group to save with; default the world.
        resume_from_checkpoint (bool): resume from the newest complete DCP checkpoint in ``output_dir``.
        keep_last_n_checkpoints (int | None): delete older checkpoints beyond this many. Default None.

    Raises:
        ValueError: if ``output_dir`` is inside ``checkpoint_dir``, or resuming finds no checkpoint.
    """

    def __init__(
        self,
        checkpoint_dir: str | Path | None = None,
        output_dir: str | Path | None = None,
        process_group: dist.ProcessGroup | None = None,
        resume_from_checkpoint: bool = False,
        keep_last_n_checkpoints: int | None = None,
    ) -> None:
        if output_dir is None:
            raise ValueError("DistributedCheckpointer needs `output_dir`: the directory the checkpoints go to.")
        self._output_dir = Path(output_dir)
        if checkpoint_dir is not None:
            source, target = Path(checkpoint_dir).resolve(), self._output_dir.resolve()
            if target == source or source in target.parents:
                raise ValueError(
                    f"output_dir ({output_dir}) is inside checkpoint_dir ({checkpoint_dir}); choose an output_dir "
                    "outside the model's directory."
                )
        self._keep_last_n = keep_last_n_checkpoints
        self._group = process_group
        self._resume_dir = None
        if get_rank() == 0:
            remove_stale_temporaries(self._output_dir)
        _barrier(self._group)
        if resume_from_checkpoint:
            self._resume_dir = find_latest_checkpoint(self._output_dir, format_name=_FORMAT)
            if self._resume_dir is None:
                raise ValueError(
                    f"resume_from_checkpoint is true but {self._output_dir} holds no complete distributed "
                    f"checkpoint. It holds: {describe_dir(self._output_dir)}. Set `resume_from_checkpoint: false` "
                    "to start a new run."
                )

    @property
    def resume_dir(self) -> Path | None:
        """The checkpoint directory this run resumes from (None when not resuming)."""
        return self._resume_dir

    def save_checkpoint(
        self,
        state_dict: dict[str, Any],
        epoch: int | None = None,
        step: int | None = None,
        *,
        config: Mapping[str, Any] | str | None = None,
    ) -> Path:
        """Writes every rank's shards to ``output_dir/step_{step}/`` (or ``epoch_{epoch}/``), atomically.

        A collective: every rank calls it, and every rank returns, or raises the same error, at the same point.

        Args:
            state_dict (dict[str, Any]): this rank's state: (sharded) tensors, nested dicts, plain values.
            epoch (int | None): epochs completed.
            step (int | None): global steps completed; names the directory when given.
            config (Mapping[str, Any] | str | None): the resolved run config, written as ``config.yaml``.

        Returns:
            Path: the published checkpoint directory.

        Raises:
            CheckpointSaveError: on every rank, when a write fails on any of them (a full disk, a file-size limit):
                the message names the rank that failed, ``output_dir`` and the previous complete checkpoint, which
                stays as it was (the partial one is removed).
        """
        import torch.distributed.checkpoint as dcp

        name = checkpoint_dir_name(epoch, step)
        temp_dir = temporary_dir_for(self._output_dir, name)
        final = self._output_dir / name
        failure = self._on_coordinator(lambda: _empty_dir(temp_dir))
        if failure is None:
            try:
                dcp.save(state_dict, checkpoint_id=str(temp_dir), process_group=self._group)
            except dcp.api.CheckpointException as error:
                # DCP gathers every rank's error and raises them on every rank: each rank sees the same failures
                failure = _write_failure(error)
                if failure is None:  # not a failed write (a bug, say): DCP's own error
                    self._on_coordinator(lambda: shutil.rmtree(temp_dir, ignore_errors=True))
                    raise
        if failure is None:
            marker = {"format": _FORMAT, "epoch": epoch, "global_step": step, "recipe_state": True}
            failure = self._on_coordinator(lambda: _publish(temp_dir, final, marker, config))
        if failure is not None:
            self._on_coordinator(lambda: shutil.rmtree(temp_dir, ignore_errors=True))
            raise CheckpointSaveError(_save_failed_message(self._output_dir, name, failure))
        failure = self._on_coordinator(lambda: prune_checkpoints(self._output_dir, self._keep_last_n))
        if failure is not None and _group_rank(self._group) == 0:  # the new checkpoint is saved: go on
            log.warning(f"Could not remove old checkpoints in {self._output_dir} (keep_last_n_checkpoints): {failure}")
        return final

    def _on_coordinator(self, action: Callable[[], Any]) -> OSError | None:
        # Runs `action` on the group's rank 0 and tells every rank whether it failed (with an OSError): a collective,
        # so no rank waits for a rank that stopped, and all of them go on, or stop, together.
        failure = None
        if _group_rank(self._group) == 0:
            try:
                action()
            except OSError as error:
                failure = f"rank 0: {error}"
        if dist.is_available() and dist.is_initialized():
            message = [failure]
            source = 0 if self._group is None else dist.get_global_rank(self._group, 0)
            dist.broadcast_object_list(message, src=source, group=self._group)
            failure = message[0]
        return None if failure is None else OSError(failure)

    def load_checkpoint(self, state_dict: dict[str, Any], checkpoint_path: str | Path | None = None) -> dict[str, Any]:
        """Loads a checkpoint into ``state_dict`` in place (DCP fills the given, correctly sharded, tensors).

        Args:
            state_dict (dict[str, Any]): this rank's state with the structure that was saved.
            checkpoint_path (str | Path | None): the checkpoint directory; default the one being resumed.

        Returns:
            dict[str, Any]: ``state_dict``, filled.

        Raises:
            ValueError: if there is no checkpoint to load, or it holds pickled objects other than plain data.
        """
        import torch.distributed.checkpoint as dcp

        path = Path(checkpoint_path) if checkpoint_path is not None else self._resume_dir
        if path is None:
            raise ValueError(
                "No checkpoint to load: pass checkpoint_path, or construct with resume_from_checkpoint=True."
            )
        try:
            planner = _weights_only_load_planner()
            dcp.load(state_dict, checkpoint_id=str(path), planner=planner, process_group=self._group)
        except dcp.api.CheckpointException as error:
            # DCP wraps every rank's error in a BaseException; surface ours (unsafe or missing data) as ValueError.
            for failure, _ in error.failures.values():
                if isinstance(failure, ValueError):
                    raise ValueError(f"Loading the distributed checkpoint {path} failed: {failure}") from error
            raise
        return state_dict


def gather_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict on CPU, for Hugging Face / PEFT outputs.

    Under FSDP2 every rank must call it (it all-gathers); rank 0 receives the full dict and other ranks an empty
    one. Without a process group it is the model's state dict moved to CPU.

    Args:
        model (nn.Module): the model, sharded with ``fully_shard`` or not.

    Returns:
        dict[str, torch.Tensor]: parameter and buffer names to full CPU tensors (empty on ranks other than 0).
    """
    if dist.is_available() and dist.is_initialized():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {key: value.detach().cpu() for key, value in model.state_dict().items()}
