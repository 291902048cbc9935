"""The bookkeeping every training recipe shares, written once: steps per epoch, the payload of ``recipe_state.pt``
(one layout for every recipe, seed and RNG states included) and its restore, the loss chosen for the model's
output, activation offloading, and the validation loss.

The recipes call these in their own order; what each one computes is the same for all of them.
"""

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tune.modules.loss import (
    LOSS_REDUCTIONS,
    CEWithChunkedOutputLoss,
    LinearCrossEntropyLoss,
    ReducedLoss,
    loss_reduction,
    shift_labels,
)
from tune.training._adapters import lora_checkpoint_payload
from tune.training._compile import compile_loss
from tune.training._loss_scaling import num_loss_tokens
from tune.training.activations import OffloadActivations, activation_offloading_supported
from tune.training.checkpointing import (
    DATALOADER_KEY,
    EPOCHS_KEY,
    LR_SCHEDULER_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    RNG_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
    get_rng_state,
    set_rng_state,
)
from tune.utils import TuneError, get_logger, log_rank_zero

if TYPE_CHECKING:
    from tune.training._parallel import ParallelDims

log = get_logger(name="tune.training")

FINETUNING_SCHEDULE_KEY = "finetuning_schedule"


def steps_per_epoch(
    num_batches: int, gradient_accumulation_steps: int, max_steps_per_epoch: int | None, num_ranks: int = 1
) -> int:
    """Optimizer steps in one epoch: full groups of ``gradient_accumulation_steps`` batches, capped.

    Args:
        num_batches (int): batches the data loader gives per epoch (per data-parallel rank).
        gradient_accumulation_steps (int): batches per optimizer step.
        max_steps_per_epoch (int | None): the cap, or ``None``.
        num_ranks (int): data-parallel ranks, for the message.

    Returns:
        int: the number of steps, at least 1.

    Raises:
        ValueError: when the data does not fill one optimizer step.
    """
    if max_steps_per_epoch is not None and max_steps_per_epoch < 1:
        raise ValueError(f"max_steps_per_epoch must be >= 1, or null for no cap; got {max_steps_per_epoch}")
    steps = num_batches // gradient_accumulation_steps
    if max_steps_per_epoch is not None:
        steps = min(steps, max_steps_per_epoch)
    if steps < 1:
        who = "the dataset gives" if num_ranks == 1 else f"each of the {num_ranks} data-parallel ranks gets"
        more = "" if num_ranks == 1 else ", use fewer processes"
        raise ValueError(
            f"{who} {num_batches} full batches, fewer than gradient_accumulation_steps={gradient_accumulation_steps}"
            f": not one optimizer step per epoch. Lower batch_size or gradient_accumulation_steps{more}, or use "
            "more data"
        )
    return steps


def progress_state(
    *,
    seed: int,
    epochs_run: int,
    total_epochs: int,
    max_steps_per_epoch: int | None,
    global_step: int,
    steps_in_epoch: int,
    samples_per_step: int,
    sampler: Any,
    lr_scheduler: Any = None,
    finetuning_schedule: Any = None,
) -> dict[str, Any]:
    """Where a run is, for ``recipe_state.pt``: everything but the model and optimizer state.

    The layout is the same for every recipe (single-device recipes add ``optimizer``; distributed ones save this
    next to their sharded state): the seed, epochs and steps run, the run length, the data loader's position, the
    LR scheduler, the finetuning schedule's phase, and the RNG states (every rank draws the same numbers; rank
    0's are saved).

    Args:
        seed (int): the seed the run uses (drawn or configured).
        epochs_run (int): completed epochs.
        total_epochs (int): epochs of the whole run.
        max_steps_per_epoch (int | None): the cap on steps per epoch.
        global_step (int): optimizer steps taken.
        steps_in_epoch (int): optimizer steps taken in the current epoch.
        samples_per_step (int): samples one optimizer step consumes on this rank (batch size x accumulation).
        sampler (Any): the training sampler (``StatefulDistributedSampler``).
        lr_scheduler (Any): the LR scheduler, or ``None``.
        finetuning_schedule (Any): the ``FinetuningSchedule``, or ``None``.

    Returns:
        dict[str, Any]: the state, keyed by the constants of ``tune.training``.
    """
    state = {
        SEED_KEY: seed,
        EPOCHS_KEY: epochs_run,
        TOTAL_EPOCHS_KEY: total_epochs,
        MAX_STEPS_KEY: max_steps_per_epoch,
        STEPS_KEY: global_step,
        DATALOADER_KEY: sampler.state_dict(num_consumed=steps_in_epoch * samples_per_step),
        LR_SCHEDULER_KEY: lr_scheduler.state_dict() if lr_scheduler is not None else None,
        RNG_KEY: get_rng_state(),
    }
    if finetuning_schedule is not None:
        state[FINETUNING_SCHEDULE_KEY] = finetuning_schedule.state_dict()
    return state


def restore_progress(
    state: Mapping[str, Any],
    *,
    seed: int | None,
    max_steps_per_epoch: int | None,
    sampler: Any,
    load_optimizer: Callable[[], None],
    lr_scheduler: Any = None,
    finetuning_schedule: Any = None,
    logger: logging.Logger = log,
) -> tuple[int, int, int]:
    """Puts a run back where :func:`progress_state` left it; call it last in setup.

    The seed is part of the run: with ``seed: null`` the resumed run takes the checkpoint's (the one drawn when
    the run began), so it sees the data in the order the uninterrupted run would. Then, in order: the finetuning
    schedule's phase (its param groups must exist before the optimizer state loads into them),
    ``load_optimizer()``, the LR scheduler, the sampler's position, and the RNG states last (setup drew random
    numbers that the uninterrupted run did not).

    Args:
        state (Mapping[str, Any]): what :func:`progress_state` returned, as saved.
        seed (int | None): the config's ``seed``; ``None`` takes the checkpoint's.
        max_steps_per_epoch (int | None): this run's cap (a different one is warned about: the data changes).
        sampler (Any): the training sampler (its ``seed`` is set to the run's).
        load_optimizer (Callable[[], None]): loads the optimizer state (the recipe knows where it is saved).
        lr_scheduler (Any): the LR scheduler, or ``None``.
        finetuning_schedule (Any): the ``FinetuningSchedule``, or ``None``.
        logger (logging.Logger): where the lines about the restore go (on rank 0 only).

    Returns:
        tuple[int, int, int]: ``(epochs_run, global_step, seed)``.

    Raises:
        TuneError: when the config's seed differs from the run's, or the saved data position cannot be resumed
            (a different dataset, shuffle or number of data-parallel ranks), naming what changed.
    """
    run_seed = state[SEED_KEY]
    if seed is None:
        log_rank_zero(logger, f"seed: null: resuming with the run's seed {run_seed} (drawn when it began).")
    elif seed != run_seed:
        raise TuneError(
            f"resume_from_checkpoint: the config's seed ({seed}) differs from the seed the run began with "
            f"({run_seed}); the resumed run would not see the data an uninterrupted run would. Set seed: "
            f"{run_seed} (or null) to resume, or resume_from_checkpoint: False to start a new run"
        )
    sampler.seed = run_seed
    if state[MAX_STEPS_KEY] != max_steps_per_epoch:
        log_rank_zero(
            logger,
            f"Resuming with max_steps_per_epoch={max_steps_per_epoch} but the checkpoint was written with "
            f"{state[MAX_STEPS_KEY]}: the resumed run will not see the data an uninterrupted run would.",
            logging.WARNING,
        )
    if finetuning_schedule is not None and state.get(FINETUNING_SCHEDULE_KEY) is not None:
        for line in finetuning_schedule.load_state_dict(state[FINETUNING_SCHEDULE_KEY]):
            log_rank_zero(logger, line)
    try:
        load_optimizer()
        if lr_scheduler is not None and state[LR_SCHEDULER_KEY] is not None:
            lr_scheduler.load_state_dict(state[LR_SCHEDULER_KEY])
    except (KeyError, IndexError, ValueError, RuntimeError) as err:
        raise TuneError(
            f"resume_from_checkpoint: the saved optimizer or LR scheduler state does not fit this run's "
            f"({type(err).__name__}: {err}); it was written by a different recipe, model or optimizer. Resume with "
            "the config of the interrupted run, or set resume_from_checkpoint: False to start a new run"
        ) from err
    try:
        sampler.load_state_dict(state[DATALOADER_KEY])
    except ValueError as err:
        raise TuneError(f"resume_from_checkpoint: {err}") from err
    set_rng_state(state[RNG_KEY])
    return state[EPOCHS_KEY], state[STEPS_KEY], run_seed


def prepare_loss(loss_fn: nn.Module, model: nn.Module, *, compile: bool = False, reduction: str = "sum") -> nn.Module:
    """Fits the configured loss to the model's output, the same way in every recipe.

    A loss declares what it returns in its ``reduction`` attribute (``tune.modules.loss.loss_reduction``): tune's
    cross-entropy losses and ``nn.CrossEntropyLoss`` average over the non-ignored labels by default, and a loss
    without the attribute (one written for torchtune) is read as such a mean. The recipes normalise by the token
    count of the whole step, so they ask for ``reduction`` (the sum by default): tune's cross-entropy losses are
    set to it, any other loss is wrapped in :class:`tune.modules.loss.ReducedLoss`, which multiplies its mean by
    the number of labels not equal to its ``ignore_index`` (-100 when it has none). A torchtune loss thus gives
    torchtune's logged loss and gradients.

    A configured ``CEWithChunkedOutputLoss`` (the name torchtune's configs use) becomes
    :class:`LinearCrossEntropyLoss` when the model can skip its output projection: the same value, but the
    projection runs inside the loss one chunk at a time, so full ``[tokens, vocab]`` logits never exist. A loss
    with ``set_model_output`` then takes over the model's output layer. With ``compile`` the loss is compiled.

    Args:
        loss_fn (nn.Module): the loss as configured.
        model (nn.Module): the model it scores.
        compile (bool): compile the loss (``tune.training.compile_loss``).
        reduction (str): ``"sum"`` (what the recipes' step normalisation expects) or ``"mean"``.

    Returns:
        nn.Module: the loss to call as ``loss_fn(model_outputs, labels)``; it returns ``reduction``.

    Raises:
        ValueError: for a ``reduction`` other than ``"sum"`` or ``"mean"``, asked for or declared by the loss.
    """
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"reduction must be one of {LOSS_REDUCTIONS}; received {reduction!r}.")
    declared = loss_reduction(loss_fn)
    if isinstance(loss_fn, (CEWithChunkedOutputLoss, LinearCrossEntropyLoss)):
        loss_fn.reduction = declared = reduction
    if isinstance(loss_fn, CEWithChunkedOutputLoss) and hasattr(model, "skip_output_layer"):
        loss_fn = LinearCrossEntropyLoss(loss_fn.num_output_chunks, loss_fn.ignore_index, loss_fn.reduction)
        log.info("loss: CEWithChunkedOutputLoss runs as LinearCrossEntropyLoss (same values, no full logits).")
    if hasattr(loss_fn, "set_model_output"):
        loss_fn.set_model_output(model)  # the model now returns hidden states; the loss projects them
    if compile:
        compile_loss(loss_fn)
    if declared != reduction:
        loss_fn = ReducedLoss(loss_fn, from_reduction=declared, reduction=reduction)
    return loss_fn


def activation_offloading_context(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """The context the forward passes run in: :class:`OffloadActivations` when enabled and useful on ``device``,
    else a no-op (with a warning when it was asked for but cannot help)."""
    if not enabled:
        return contextlib.nullcontext()
    supported, reason = activation_offloading_supported(device)
    if not supported:
        log.warning("enable_activation_offloading=True is ignored: %s", reason)
        return contextlib.nullcontext()
    return OffloadActivations()


@torch.no_grad()
def validation_loss(
    loss_step: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, Any]],
    batches: Iterable[dict[str, torch.Tensor]],
    device: torch.device,
    *,
    max_steps: int | None = None,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, int]:
    """The mean token loss over validation batches: the sum of every batch's summed loss over all loss tokens.

    Args:
        loss_step (Callable): the recipe's ``loss_step`` (returns the summed loss of a batch on the device).
        batches (Iterable): the validation batches (on the CPU).
        device (torch.device): where the model runs.
        max_steps (int | None): read at most this many batches.
        all_reduce (Callable | None): sums a tensor over the data-parallel ranks (distributed recipes).

    Returns:
        tuple[float, int]: the mean loss and the number of loss tokens (over all ranks).
    """
    totals = torch.zeros(2, dtype=torch.float32, device=device)  # summed loss, loss tokens
    for i, batch in enumerate(batches):
        if max_steps is not None and i >= max_steps:
            break
        totals[1] += num_loss_tokens(shift_labels(batch["labels"])).to(device)
        loss_sum, _ = loss_step({k: v.to(device) for k, v in batch.items()})
        totals[0] += loss_sum.detach().float()
    if all_reduce is not None:
        totals = all_reduce(totals)
    loss, tokens = totals.tolist()
    return loss / max(tokens, 1.0), int(tokens)


def step_metrics(
    *,
    loss: float,
    optimizer: torch.optim.Optimizer,
    tokens_per_second: float,
    grad_norm: torch.Tensor | None = None,
    extra: Iterable[Mapping[str, Any]] = (),
    memory_device: torch.device | None = None,
    parallel: "ParallelDims | None" = None,
) -> dict[str, Any]:
    """What every recipe logs at a logging step: loss, lr, tokens/s, grad norm, the metrics of ``loss_step`` and of
    the optimizer's ``step()``, and peak memory. Reads tensors: call it at logging steps only.

    Args:
        loss (float): the mean loss since the last logging step.
        optimizer (torch.optim.Optimizer): for the current learning rate.
        tokens_per_second (float): non-padding tokens per second (over all ranks for distributed recipes).
        grad_norm (torch.Tensor | None): the last step's total gradient norm (None with optimizer_in_bwd).
        extra (Iterable[Mapping[str, Any]]): more metrics; tensor values are read as numbers.
        memory_device (torch.device | None): add the peak memory stats of this device (None: leave them out).
        parallel (ParallelDims | None): the layout of a distributed run: ``tokens_per_second`` is then this rank's,
            summed over all ranks (a collective; a tensor- or context-parallel group shares one batch and counts
            once), and
            ``tokens_per_second_per_gpu`` is logged too. None: a single-process run.

    Returns:
        dict[str, Any]: the metrics, for the metric logger.
    """
    from tune.training.lr_schedulers import get_lr
    from tune.training.memory import get_memory_stats

    metrics = {"loss": loss, "lr": get_lr(optimizer), "tokens_per_second": tokens_per_second}
    if parallel is not None:
        from tune.training._distributed import all_reduce_sum

        rank_tps = torch.tensor(tokens_per_second, dtype=torch.float64, device=parallel.mesh.device_type)
        # the ranks of a tensor- or context-parallel group share one batch: it counts once
        metrics["tokens_per_second"] = all_reduce_sum(rank_tps).item() / (parallel.tp_size * parallel.cp_size)
        metrics["tokens_per_second_per_gpu"] = metrics["tokens_per_second"] / parallel.world_size
    if grad_norm is not None:
        metrics["grad_norm"] = grad_norm.item()
    for more in extra:
        metrics.update({k: v.item() if torch.is_tensor(v) else v for k, v in more.items()})
    if memory_device is not None:
        metrics.update(get_memory_stats(memory_device, reset_stats=False))
    return metrics


class _RunState:
    # what RecipeState and ShardedRecipeState share: the run's objects, its length and the checkpoint payload

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        *,
        checkpointer: Any,
        sampler: Any,
        seed: int,
        epochs: int,
        steps_per_epoch: int,
        max_steps_per_epoch: int | None,
        samples_per_step: int,
        lr_scheduler: Any = None,
        finetuning_schedule: Any = None,
        adapter_config: Mapping[str, Any] | None = None,
        save_adapter_weights_only: bool = False,
        total_steps: int | None = None,
    ) -> None:
        if save_adapter_weights_only and adapter_config is None:
            raise ValueError("save_adapter_weights_only needs a LoRA/DoRA model (adapter_config); this one has none.")
        self._model = model
        self._optimizer = optimizer
        self._checkpointer = checkpointer
        self._sampler = sampler
        self.seed = seed
        self._epochs = epochs
        self._steps_per_epoch = steps_per_epoch
        self._max_steps_per_epoch = max_steps_per_epoch
        self._samples_per_step = samples_per_step
        self._lr_scheduler = lr_scheduler
        self._finetuning_schedule = finetuning_schedule
        self._adapter_config = dict(adapter_config) if adapter_config is not None else None
        self._adapter_only = save_adapter_weights_only
        self._total_steps = total_steps if total_steps is not None else epochs * steps_per_epoch

    def _is_last_step(self, global_step: int) -> bool:
        return global_step >= self._total_steps

    def _progress(self, epoch: int, epochs_run: int, global_step: int) -> dict[str, Any]:
        return progress_state(
            seed=self.seed,
            epochs_run=epochs_run,
            total_epochs=self._epochs,
            max_steps_per_epoch=self._max_steps_per_epoch,
            global_step=global_step,
            steps_in_epoch=global_step - epoch * self._steps_per_epoch,
            samples_per_step=self._samples_per_step,
            sampler=self._sampler,
            lr_scheduler=self._lr_scheduler,
            finetuning_schedule=self._finetuning_schedule,
        )

    def _payload(self, model_state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        if self._adapter_config is None:
            return {MODEL_KEY: model_state}
        return lora_checkpoint_payload(model_state, self._adapter_config, adapter_only=self._adapter_only)


class RecipeState(_RunState):
    """What a single-process recipe saves and resumes, the same way in every recipe.

    A save hands the run's checkpointer the model (for a LoRA/DoRA model: the adapter in the PEFT format, its
    config and, unless ``save_adapter_weights_only``, the merged model: :func:`tune.training.lora_checkpoint_payload`)
    and, unless it is the run's last step, the optimizer state and the progress (:func:`progress_state`), written
    as ``recipe_state.pt``. A restore puts the optimizer, finetuning-schedule phase, LR scheduler, data position,
    seed and RNG states back from what the checkpointer read (:func:`restore_progress`).

    Build it at the end of setup, once the optimizer, sampler and schedulers exist.

    Args:
        model (nn.Module): the model being trained.
        optimizer (Any): its optimizer (an ``OptimizerInBackward`` too).
        checkpointer (Any): the run's checkpointer (``FullModelHFCheckpointer``, ...).
        sampler (Any): the training sampler (``StatefulDistributedSampler``).
        seed (int): the seed the run uses.
        epochs (int): epochs of the run.
        steps_per_epoch (int): optimizer steps per epoch.
        max_steps_per_epoch (int | None): the configured cap on steps per epoch.
        samples_per_step (int): samples one optimizer step consumes (batch size x accumulation).
        lr_scheduler (Any): the LR scheduler, or ``None``.
        finetuning_schedule (Any): the ``FinetuningSchedule``, or ``None``.
        adapter_config (Mapping[str, Any] | None): for a LoRA/DoRA model, ``tune.modules.peft.get_adapter_config``
            of it; ``None`` for a fully trained model.
        save_adapter_weights_only (bool): with ``adapter_config``, write the adapter without the merged model.
        total_steps (int | None): the run's last step, after which nothing is saved to resume from; default
            ``epochs * steps_per_epoch`` (PPO counts steps, not epochs).

    Raises:
        ValueError: ``save_adapter_weights_only`` without ``adapter_config``.
    """

    def save(
        self,
        *,
        epoch: int,
        epochs_run: int,
        global_step: int,
        config: Mapping[str, Any] | None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Writes ``step_N/`` with the run's checkpointer (and ``recipe_state.pt`` unless the run is over).

        Args:
            epoch (int): the epoch being trained (0-based), for the data position.
            epochs_run (int): epochs completed.
            global_step (int): optimizer steps taken; names ``step_N/``.
            config (Mapping[str, Any] | None): the resolved run config, written into the checkpoint.
            extra (Mapping[str, Any] | None): more state of the recipe to resume with (tensors and plain data),
                saved beside the progress.
        """
        intermediate = not self._is_last_step(global_step)
        state = self._payload(self._model.state_dict())
        if intermediate:
            state[OPT_KEY] = self._optimizer.state_dict()
            state.update(self._progress(epoch, epochs_run, global_step))
            state.update(extra or {})
        self._checkpointer.save_checkpoint(
            state,
            epoch=epochs_run,
            step=global_step,
            intermediate_checkpoint=intermediate,
            adapter_only=self._adapter_only,
            config=config,
        )

    def restore(
        self, checkpoint: Mapping[str, Any], seed: int | None, logger: logging.Logger = log
    ) -> tuple[int, int, int]:
        """Puts the run back where the checkpoint being resumed left it; call it last in setup.

        Args:
            checkpoint (Mapping[str, Any]): what the checkpointer's ``load_checkpoint()`` returned when resuming.
            seed (int | None): the config's ``seed`` (``None`` takes the checkpoint's).
            logger (logging.Logger): where the lines about the restore go.

        Returns:
            tuple[int, int, int]: ``(epochs_run, global_step, seed)`` of the resumed run.
        """
        epochs_run, global_step, self.seed = restore_progress(
            checkpoint,
            seed=seed,
            max_steps_per_epoch=self._max_steps_per_epoch,
            sampler=self._sampler,
            load_optimizer=lambda: self._optimizer.load_state_dict(checkpoint[OPT_KEY]),
            lr_scheduler=self._lr_scheduler,
            finetuning_schedule=self._finetuning_schedule,
            logger=logger,
        )
        log_rank_zero(logger, f"Resumed after {global_step} optimizer steps ({epochs_run} epochs complete).")
        return epochs_run, global_step, self.seed
