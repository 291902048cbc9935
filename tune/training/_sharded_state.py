"""The plumbing every sharded (FSDP2) recipe shares: its recipe state (sharded DCP
checkpoints to resume from plus the gathered Hugging Face / PEFT output), and the reductions of logged metrics
over ranks. The recipes keep their loops; what is saved, restored and summed is decided here once.
"""

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tune.modules.peft import is_adapter_key
from tune.training._distributed import all_reduce_sum, errors_on_all_ranks, gather_cpu_state_dict
from tune.training._finetuning_schedule import clean_param_name
from tune.training._recipe_state import _RunState, restore_progress
from tune.training.checkpointing import MODEL_KEY, OPT_KEY, DistributedCheckpointer
from tune.utils import get_logger, log_rank_zero

log = get_logger(name="tune.training")

PROGRESS_KEY = "progress"
# the sharded checkpoints of a run go here, inside output_dir, apart from the gathered step_N/ outputs
DCP_SUBDIR = "dcp"


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean over all ranks of a tensor every rank holds (e.g. each rank's share of the logged loss).

    A collective when distributed; the tensor itself on one process.

    Args:
        tensor (torch.Tensor): this rank's value.

    Returns:
        torch.Tensor: the sum over ranks divided by the world size.
    """
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return all_reduce_sum(tensor) / world_size


def saved_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: str | Path) -> dict:
    """The sharded optimizer state to load a DCP checkpoint into: the fresh optimizer's, less the parameters that
    had no state when the checkpoint was written.

    Parameters not stepped yet when the run saved (those a finetuning schedule had just unfrozen, say) must get
    their state when they first step in the resumed run too, as they did in the uninterrupted one.

    Args:
        model (nn.Module): the (sharded) model.
        optimizer (torch.optim.Optimizer): its optimizer, its states created.
        checkpoint (str | Path): the DCP checkpoint directory being resumed.

    Returns:
        dict: the optimizer state dict (``get_optimizer_state_dict``'s layout) for ``dcp.load``.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer)
    saved = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    prefix = f"{OPT_KEY}.state."
    stepped = {key[len(prefix) :].rsplit(".", 1)[0] for key in saved if key.startswith(prefix)}
    state["state"] = {name: value for name, value in state["state"].items() if name in stepped}
    return state


def sharded_model_state(model: nn.Module, *, adapters_only: bool = False) -> dict[str, Any]:
    """This rank's shards of the model's state dict, for DCP; with ``adapters_only`` the LoRA/DoRA entries and the
    other trainable parameters (a reward model's score head, say) alone: a LoRA run's frozen base weights do not
    change, they are read again from the input checkpoint.

    Args:
        model (nn.Module): the (sharded) model.
        adapters_only (bool): keep only the adapter entries and the trainable parameters.

    Returns:
        dict[str, Any]: the state dict, sharded tensors included.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model)
    if adapters_only:
        # named as the state dict names them: without the activation-checkpointing / compile wrappers' parts
        trainable = {clean_param_name(name) for name, param in model.named_parameters() if param.requires_grad}
        state = {key: value for key, value in state.items() if is_adapter_key(key) or key in trainable}
    return state


def sharded_optimizer_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """This rank's shards of the optimizer state, keyed by parameter name; an optimizer stepped in backward
    (``OptimizerInBackward``: one optimizer per parameter) gives its own ``state_dict()``.

    Args:
        model (nn.Module): the (sharded) model.
        optimizer (Any): its optimizer.

    Returns:
        dict[str, Any]: the optimizer state dict.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if getattr(optimizer, "optim_map", None) is not None:
        return optimizer.state_dict()
    return get_optimizer_state_dict(model, optimizer)


def save_sharded_checkpoint(
    checkpointer: DistributedCheckpointer,
    model: nn.Module,
    optimizer: Any,
    extra: Mapping[str, Any],
    *,
    adapters_only: bool = False,
    epoch: int | None = None,
    step: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Writes every rank's shards of the model (see :func:`sharded_model_state`) and optimizer, with ``extra``
    (progress and the like), as one DCP checkpoint. A collective.

    Args:
        checkpointer (DistributedCheckpointer): where and how it is written.
        model (nn.Module): the (sharded) model.
        optimizer (Any): its optimizer.
        extra (Mapping[str, Any]): more entries (plain data and tensors), saved under their own keys.
        adapters_only (bool): save the adapter entries of the model alone.
        epoch (int | None): epochs completed.
        step (int | None): steps completed; names the directory when given.
        config (Mapping[str, Any] | None): the run's config, written as ``config.yaml``.

    Returns:
        Path: the published checkpoint.
    """
    state = {
        **extra,
        MODEL_KEY: sharded_model_state(model, adapters_only=adapters_only),
        OPT_KEY: sharded_optimizer_state(model, optimizer),
    }
    return checkpointer.save_checkpoint(state, epoch=epoch, step=step, config=config)


def load_sharded_checkpoint(
    checkpointer: DistributedCheckpointer,
    model: nn.Module,
    optimizer: Any,
    extra: Mapping[str, Any] | None = None,
    *,
    adapters_only: bool = False,
    path: str | Path | None = None,
) -> dict[str, Any]:
    """Reads a checkpoint of :func:`save_sharded_checkpoint` into the model and optimizer in place, each rank
    its own shards. The optimizer keeps no state for parameters that had none when it was saved
    (:func:`saved_optimizer_state`). A collective.

    Args:
        checkpointer (DistributedCheckpointer): the checkpointer that wrote it.
        model (nn.Module): the (sharded) model, set up as in the run that saved.
        optimizer (Any): its optimizer.
        extra (Mapping[str, Any] | None): templates of the other entries to read (their saved structure).
        adapters_only (bool): the checkpoint holds the adapter entries of the model alone.
        path (str | Path | None): the checkpoint; default the one ``checkpointer`` resumes from.

    Returns:
        dict[str, Any]: everything read: ``MODEL_KEY``, ``OPT_KEY`` and the ``extra`` entries.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path) if path is not None else checkpointer.resume_dir
    in_backward = getattr(optimizer, "optim_map", None) is not None
    state = {
        **(extra or {}),
        MODEL_KEY: sharded_model_state(model, adapters_only=adapters_only),
        OPT_KEY: optimizer.state_dict() if in_backward else saved_optimizer_state(model, optimizer, path),
    }
    checkpointer.load_checkpoint(state, checkpoint_path=path)
    set_model_state_dict(model, state[MODEL_KEY], options=StateDictOptions(strict=not adapters_only))
    if in_backward:
        optimizer.load_state_dict(state[OPT_KEY])
    else:  # strict=False: the parameters saved_optimizer_state left out keep no state, as in the first run
        set_optimizer_state_dict(model, optimizer, state[OPT_KEY], options=StateDictOptions(strict=False))
    return state


class ShardedRecipeState(_RunState):
    """Saves and restores the training state of a sharded run, the same way in every distributed recipe.

    A save writes, unless it is the run's last step, every rank's shards of the trainable weights (only the
    adapters of a LoRA model: the frozen base is the input checkpoint's), the optimizer and the progress
    (:func:`tune.training.progress_state`) to ``output_dir/dcp/step_N/`` with DCP; then it gathers the full model
    to rank 0, which writes ``output_dir/step_N/`` with the run's checkpointer: what
    :class:`~tune.training.RecipeState` writes, without ``recipe_state.pt``. A restore reads the newest complete
    sharded checkpoint back: weights, optimizer (see :func:`saved_optimizer_state`), finetuning-schedule phase, LR
    scheduler, data position, seed and RNG states.

    Build it at the end of setup, once the optimizer, sampler and schedulers exist. Every method is a collective.

    Args:
        model (nn.Module): the sharded model.
        optimizer (torch.optim.Optimizer): its optimizer.
        output_dir (str | Path): the run's output directory; the sharded checkpoints go to its ``dcp/``.
        keep_last_n_checkpoints (int | None): keep this many sharded checkpoints (None: all).
        resume_from_checkpoint (bool): find the newest complete sharded checkpoint to :meth:`restore` from.
        **kwargs: the arguments of :class:`~tune.training.RecipeState` (``checkpointer``, ``sampler``, ``seed``,
            ``epochs``, ``steps_per_epoch``, ``max_steps_per_epoch``, ``samples_per_step``, ``lr_scheduler``,
            ``finetuning_schedule``, ``adapter_config``, ``save_adapter_weights_only``).

    Raises:
        ValueError: resuming when ``output_dir/dcp`` holds no complete sharded checkpoint, or with
            ``save_adapter_weights_only`` and no ``adapter_config``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        output_dir: str | Path,
        keep_last_n_checkpoints: int | None = None,
        resume_from_checkpoint: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, optimizer, **kwargs)
        self._dcp = DistributedCheckpointer(
            output_dir=Path(output_dir) / DCP_SUBDIR,
            resume_from_checkpoint=resume_from_checkpoint,
            keep_last_n_checkpoints=keep_last_n_checkpoints,
        )

    @property
    def resume_dir(self) -> Path | None:
        """The sharded checkpoint this run resumes from (None when it does not resume)."""
        return self._dcp.resume_dir

    def save(self, *, epoch: int, epochs_run: int, global_step: int, config: Mapping[str, Any] | None) -> None:
        """Writes the sharded state to resume from (unless the run is over) and the gathered outputs.

        Args:
            epoch (int): the epoch being trained (0-based), for the data position.
            epochs_run (int): epochs completed.
            global_step (int): optimizer steps taken; names ``step_N/``.
            config (Mapping[str, Any] | None): the resolved run config, written into both checkpoints.
        """
        if not self._is_last_step(global_step):
            save_sharded_checkpoint(
                self._dcp,
                self._model,
                self._optimizer,
                {PROGRESS_KEY: self._progress(epoch, epochs_run, global_step)},
                adapters_only=self._adapter_config is not None,
                epoch=epochs_run,
                step=global_step,
                config=config,
            )
        # a collective; only rank 0 receives the full tensors (NF4 base weights dequantised)
        key_filter = is_adapter_key if self._adapter_only else None
        full_state = gather_cpu_state_dict(self._model, key_filter=key_filter)
        with errors_on_all_ranks():  # the others wait for rank 0's write, and stop with it if it fails
            if dist.get_rank() == 0:
                self._checkpointer.save_checkpoint(
                    self._payload(full_state),
                    epoch=epochs_run,
                    step=global_step,
                    adapter_only=self._adapter_only,
                    config=config,
                )

    def restore(self, seed: int | None, logger: logging.Logger = log) -> tuple[int, int, int]:
        """Puts the run back where the newest sharded checkpoint left it; call it last in setup.

        Args:
            seed (int | None): the config's ``seed`` (``None`` takes the checkpoint's; another value than the
                run's is refused, see :func:`tune.training.restore_progress`).
            logger (logging.Logger): where the lines about the restore go (rank 0 only).

        Returns:
            tuple[int, int, int]: ``(epochs_run, global_step, seed)`` of the resumed run.
        """
        saved = self._dcp.load_checkpoint({PROGRESS_KEY: self._progress(0, 0, 0)})[PROGRESS_KEY]
        epochs_run, global_step, self.seed = restore_progress(
            saved,
            seed=seed,
            max_steps_per_epoch=self._max_steps_per_epoch,
            sampler=self._sampler,  # its position is per data-parallel rank: resumes only with as many of them
            load_optimizer=self._load_weights_and_optimizer,  # after the schedule's phase, before the LR
            lr_scheduler=self._lr_scheduler,
            finetuning_schedule=self._finetuning_schedule,
            logger=logger,
        )
        log_rank_zero(
            logger,
            f"Resumed from {self.resume_dir} after {global_step} optimizer steps ({epochs_run} epochs complete).",
        )
        return epochs_run, global_step, self.seed

    def _load_weights_and_optimizer(self) -> None:
        load_sharded_checkpoint(self._dcp, self._model, self._optimizer, adapters_only=self._adapter_config is not None)
