"""torchtune's config-driven checkpointing client: the checkpointer named in a recipe config, driven for a recipe.

:class:`CheckpointClient` builds the config's ``checkpointer`` on first use and saves a (possibly FSDP2-sharded)
model and its optimizer with it: the full state is gathered to rank 0, which writes the checkpoint in the model's
input format. With ``enable_async_checkpointing`` set, intermediate checkpoints hold the sharded state instead,
written by every rank with :class:`DistributedCheckpointer` under ``output_dir/dcp/``; tune writes them
synchronously (the same files, without overlapping the next epoch), and
:meth:`CheckpointClient.load_distributed_checkpoint` resumes from the newest of them.

It is a config-reading front of what tune's distributed recipes use (``tune.training.save_sharded_checkpoint``,
``load_sharded_checkpoint``, ``lora_checkpoint_payload``), so a migrated torchtune recipe and tune's own write the
same files through the same code. It reads a config, so it sits above ``tune.training``; torchtune's path
(``tune.training.checkpointing._checkpoint_client``) is an alias of this module (see ``tune/__init__.py``).
"""

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tune.config._instantiate import instantiate
from tune.training import (
    DCP_SUBDIR,
    errors_on_all_ranks,
    gather_cpu_state_dict,
    get_full_optimizer_state_dict,
    load_sharded_checkpoint,
    lora_checkpoint_payload,
    save_sharded_checkpoint,
)
from tune.training import checkpointing as keys
from tune.training.checkpointing import DistributedCheckpointer, find_latest_checkpoint
from tune.utils import get_device, get_logger, get_world_size_and_rank

log = get_logger(name=__name__)


@dataclass
class TrainingProgress:
    """Where a run stands, saved with an intermediate checkpoint so that it can resume.

    Args:
        seed (int): the run's seed.
        epochs_run (int): epochs completed.
        total_epochs (int): epochs the run trains for.
        max_steps_per_epoch (int | None): the cap on optimizer steps per epoch (None: none).
        dataloader_state_dict (dict[str, Any] | None): the data loader's ``state_dict()``, its position.
        steps_run (int | None): optimizer steps completed; saved only when given.
    """

    seed: int
    epochs_run: int
    total_epochs: int
    max_steps_per_epoch: int | None
    dataloader_state_dict: dict[str, Any] | None = None
    steps_run: int | None = None

    def state_dict(self) -> dict[str, Any]:
        """The progress under the recipe-state keys (``"seed"``, ``"epochs_run"``, ``"total_epochs"``, ...)."""
        state = {
            keys.SEED_KEY: self.seed,
            keys.EPOCHS_KEY: self.epochs_run,
            keys.TOTAL_EPOCHS_KEY: self.total_epochs,
            keys.MAX_STEPS_KEY: self.max_steps_per_epoch,
            keys.DATALOADER_KEY: self.dataloader_state_dict,
        }
        if self.steps_run is not None:
            state[keys.STEPS_KEY] = self.steps_run
        return state


def _optimizers_in_backward(optimizer: Any) -> dict[str, torch.optim.Optimizer] | None:
    # OptimizerInBackwardWrapper (one optimizer per parameter) exposes them as `optim_map`
    return getattr(optimizer, "optim_map", None)


class CheckpointClient:
    """Saves and loads a recipe's training state with the checkpointer its config names.

    Every method is a collective in a distributed run: every rank calls it at the same point.

    Args:
        cfg (Mapping[str, Any]): the recipe config (an OmegaConf ``DictConfig`` or a dict). Read: ``checkpointer``
            (a ``_component_`` entry, built on first use), ``device``, and, when present,
            ``resume_from_checkpoint``, ``enable_async_checkpointing`` and ``optimizer_in_bwd`` (default False).
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self._cfg = cfg
        self._checkpointer: Any = None
        self._dcp_checkpointer: DistributedCheckpointer | None = None
        self._resume_from_checkpoint = bool(cfg.get("resume_from_checkpoint", False))
        self._enable_async_checkpointing = bool(cfg.get("enable_async_checkpointing", False))
        self._optimizer_in_bwd = bool(cfg.get("optimizer_in_bwd", False))
        self._device = get_device(cfg.get("device"))
        _, rank = get_world_size_and_rank()
        self._is_rank_zero = rank == 0

    # ----------------------------------------------------------------------------------------- checkpointers
    def _get_checkpointer(self) -> Any:
        """The config's checkpointer, built on first use.

        With asynchronous checkpointing the recipe state comes from the distributed checkpoint, so the
        checkpointer does not look for one.
        """
        if self._checkpointer is None:
            resume = self._resume_from_checkpoint and not self._enable_async_checkpointing
            self._checkpointer = instantiate(self._cfg["checkpointer"], should_load_recipe_state=resume)
        return self._checkpointer

    def _get_dcp_checkpointer(self) -> DistributedCheckpointer:
        """The :class:`DistributedCheckpointer` for the sharded checkpoints, in ``output_dir/dcp/``."""
        if self._dcp_checkpointer is None:
            checkpointer = self._get_checkpointer()
            self._dcp_checkpointer = DistributedCheckpointer(
                checkpoint_dir=checkpointer._checkpoint_dir,
                output_dir=Path(checkpointer._output_dir) / DCP_SUBDIR,
            )
        return self._dcp_checkpointer

    # ----------------------------------------------------------------------------------------- saving
    def save_checkpoint(
        self,
        model: nn.Module,
        optimizer: Any,
        training_progress: TrainingProgress,
        epoch: int,
        *,
        adapter_config: dict[str, Any] | None = None,
        adapter_only: bool = False,
        single_device: bool = False,
        step: int | None = None,
    ) -> None:
        """Checkpoints the model and, unless this is the run's last epoch, the optimizer and progress.

        The checkpoint goes to ``output_dir/epoch_{epoch}/`` (``step_{step}/`` when ``step`` is given), written
        by the configured checkpointer from the full state gathered to rank 0. With
        ``enable_async_checkpointing``, an intermediate checkpoint instead holds every rank's shards, written to
        ``output_dir/dcp/`` with :class:`DistributedCheckpointer` (synchronously: tune's writer has no
        asynchronous mode).

        Args:
            model (nn.Module): the model, sharded with FSDP2 or not.
            optimizer (Any): its optimizer, or an ``OptimizerInBackwardWrapper`` with ``optimizer_in_bwd``.
            training_progress (TrainingProgress): the run's progress; ``epoch + 1 < total_epochs`` makes the
                checkpoint an intermediate one, holding the optimizer and progress to resume from.
            epoch (int): the epoch just trained (0-based), naming the directory.
            adapter_config (dict[str, Any] | None): for a LoRA/DoRA model, ``{"r", "lora_alpha", ...}``: the
                adapter is then written in the PEFT format besides the merged model. Default None.
            adapter_only (bool): write only the adapter (needs ``adapter_config``). Default False.
            single_device (bool): the model is not sharded and no process group is involved: save its state as
                it is, without gathering. Default False.
            step (int | None): optimizer steps completed; names the directory ``step_{step}`` when given.

        Raises:
            ValueError: for ``adapter_only`` without ``adapter_config``.
        """
        if adapter_only and adapter_config is None:
            raise ValueError(
                "save_checkpoint(adapter_only=True) needs adapter_config={'r': lora_rank, 'lora_alpha': lora_alpha}."
            )
        intermediate = epoch + 1 < training_progress.total_epochs
        if intermediate and self._enable_async_checkpointing and not single_device:
            self._save_sharded(model, optimizer, training_progress, epoch, step)
        else:
            self._save_full(
                model, optimizer, training_progress, epoch, step, adapter_config, adapter_only, single_device
            )

    def _save_sharded(
        self, model: nn.Module, optimizer: Any, training_progress: TrainingProgress, epoch: int, step: int | None
    ) -> None:
        start = time.perf_counter()
        progress = training_progress.state_dict()
        if progress[keys.DATALOADER_KEY] is None:
            del progress[keys.DATALOADER_KEY]  # DCP stores no None leaves worth reading back
        checkpointer = self._get_dcp_checkpointer()
        path = save_sharded_checkpoint(
            checkpointer, model, optimizer, progress, epoch=epoch, step=step, config=self._cfg
        )
        if self._is_rank_zero:
            log.info(f"Saved the sharded checkpoint {path} in {time.perf_counter() - start:.2f} s.")

    def _save_full(
        self,
        model: nn.Module,
        optimizer: Any,
        training_progress: TrainingProgress,
        epoch: int,
        step: int | None,
        adapter_config: dict[str, Any] | None,
        adapter_only: bool,
        single_device: bool,
    ) -> None:
        start = time.perf_counter()
        intermediate = epoch + 1 < training_progress.total_epochs
        checkpointer = self._get_checkpointer()
        keeps = single_device or self._is_rank_zero
        if single_device:
            model_state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
        else:
            # an adapter-only save gathers the adapter and leaves the (larger) base model sharded
            model_state = gather_cpu_state_dict(model, keeps, device=self._device, adapter_weights_only=adapter_only)
        optimizer_state = None
        if intermediate:
            optimizer_state = self._full_optimizer_state(model, optimizer, single_device)
        checkpoint: dict[str, Any] = {}
        if keeps:
            if adapter_config is not None:  # the adapter in the PEFT format, and the merged model unless adapter-only
                checkpoint = lora_checkpoint_payload(model_state, adapter_config, adapter_only=adapter_only)
            else:
                checkpoint[keys.MODEL_KEY] = model_state
            if intermediate:
                checkpoint[keys.OPT_KEY] = optimizer_state
                checkpoint.update(training_progress.state_dict())
        with self._rank_zero_writes(single_device):
            if keeps:
                path = checkpointer.save_checkpoint(
                    checkpoint,
                    epoch=epoch,
                    step=step,
                    intermediate_checkpoint=intermediate,
                    adapter_only=adapter_only,
                    config=self._cfg,
                )
                log.info(f"Saved checkpoint {path} in {time.perf_counter() - start:.2f} s.")

    def _full_optimizer_state(self, model: nn.Module, optimizer: Any, single_device: bool) -> dict[str, Any]:
        # the optimizer state keyed by parameter name (per parameter with optimizer_in_bwd), full tensors
        optimizers = _optimizers_in_backward(optimizer)
        if single_device:
            return optimizer.state_dict()
        if optimizers is None:
            return get_full_optimizer_state_dict(model, optimizer, self._is_rank_zero, device=self._device)
        return {
            name: get_full_optimizer_state_dict(model, opt, self._is_rank_zero, device=self._device)
            for name, opt in optimizers.items()
        }

    @contextlib.contextmanager
    def _rank_zero_writes(self, single_device: bool) -> Iterator[None]:
        # every rank waits for rank 0's write, and stops with it if it fails
        if single_device:
            yield
            return
        with errors_on_all_ranks():
            yield

    # ----------------------------------------------------------------------------------------- loading
    def load_base_checkpoint(self) -> dict[str, Any]:
        """Loads the configured checkpoint: the base model, or, when resuming (without asynchronous
        checkpointing), the newest intermediate checkpoint in ``output_dir`` with its recipe state.

        Returns:
            dict[str, Any]: the checkpointer's ``load_checkpoint()``: ``"model"``, and, when resuming, the
            recipe-state entries (``"optimizer"``, ``"epochs_run"``, ``"seed"``, ...).
        """
        return self._get_checkpointer().load_checkpoint()

    def load_distributed_checkpoint(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        """Resumes the model and optimizer from the newest sharded checkpoint in ``output_dir/dcp/``.

        Each rank reads its own shards into ``model`` and ``optimizer`` in place.

        Args:
            model (nn.Module): the (sharded) model, set up as in the run that saved.
            optimizer (Any): its optimizer, or an ``OptimizerInBackwardWrapper`` with ``optimizer_in_bwd``.

        Returns:
            dict[str, Any]: ``"model"``, ``"optimizer"`` and the progress: ``"seed"``, ``"epochs_run"``,
            ``"total_epochs"``, ``"max_steps_per_epoch"`` (the data-loader position is not restored).

        Raises:
            ValueError: if ``output_dir/dcp/`` holds no complete sharded checkpoint.
        """
        start = time.perf_counter()
        dcp_checkpointer = self._get_dcp_checkpointer()
        path = find_latest_checkpoint(dcp_checkpointer._output_dir, format_name="dcp")
        if path is None:
            raise ValueError(
                f"No complete sharded checkpoint in {dcp_checkpointer._output_dir} to resume from: those are "
                "written by runs with enable_async_checkpointing=True. Set resume_from_checkpoint=False to start "
                "a new run."
            )
        progress = {keys.SEED_KEY: 0, keys.EPOCHS_KEY: 0, keys.TOTAL_EPOCHS_KEY: 0, keys.MAX_STEPS_KEY: 0}
        state = load_sharded_checkpoint(dcp_checkpointer, model, optimizer, progress, path=path)
        if self._is_rank_zero:
            log.info(f"Loaded the sharded checkpoint {path} in {time.perf_counter() - start:.2f} s.")
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return state
