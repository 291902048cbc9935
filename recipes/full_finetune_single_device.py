"""Full fine-tuning of a language model on one device (CPU, one GPU or Apple MPS).

Every parameter of the model is trained. The file reads top to bottom: ``__init__`` reads and checks the config,
``setup`` builds the pieces, ``train`` holds the loop, ``loss_step`` computes the loss of one micro-batch (override
it in a copy of this recipe to change the objective), ``save_checkpoint`` writes ``output_dir/step_N/``.

    tune run full_finetune_single_device --config llama3_2/1B_full_single_device
    tune cp full_finetune_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import contextlib
import inspect
import sys
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, training, utils
from tune.data import (
    CROSS_ENTROPY_IGNORE_IDX,
    padded_collate_packed,
    padded_collate_sft,
    padding_free_collate,
)
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import CEWithChunkedOutputLoss, LinearCrossEntropyLoss, shift_labels
from tune.training.checkpointing import StatefulDistributedSampler, set_rng_state

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["*/*_full_single_device", "*/*_full_single_device_*", "demo/*full*"],
}

log = utils.get_logger("tune.recipes.full_finetune_single_device")


class FullFinetuneRecipeSingleDevice:
    """Full fine-tuning on a single device; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is normalised by the non-ignored tokens of the whole step),
    gradient clipping, any optimizer and LR scheduler by ``_component_``, ``optimizer_in_bwd``, activation
    checkpointing and offloading, ``compile``, chunked cross-entropy, fp32/bf16, validation every N steps,
    step and epoch checkpoints with exact mid-epoch resume, metric loggers, a progress bar and the profiler;
    ``model_converters`` (e.g. QAT) and a ``finetuning_schedule`` (gradual unfreezing).

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_single_device.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu" and training.configure_cpu_allocator():
            log.info("CPU: malloc keeps freed blocks for the next step (TUNE_CPU_ALLOCATOR=0 turns this off).")
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        # keys that torchtune's configs may leave out are read with torchtune's defaults
        self._log_every_n_steps = cfg.get("log_every_n_steps", 1)
        self._log_peak_memory_stats = cfg.get("log_peak_memory_stats", False)
        self._clip_grad_norm = cfg.get("clip_grad_norm", None)
        self._compile = cfg.get("compile", False)
        self._optimizer_in_bwd = cfg.get("optimizer_in_bwd", False)
        self._enable_activation_checkpointing = cfg.get("enable_activation_checkpointing", False)
        self._enable_activation_offloading = cfg.get("enable_activation_offloading", False)
        # keys of ours that torchtune's configs lack: off unless set
        self._save_every_n_steps = cfg.get("save_every_n_steps", None)
        self._run_val_every_n_steps = cfg.get("run_val_every_n_steps", None)
        self._max_validation_steps = cfg.get("max_validation_steps", None)

        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._check_config(cfg)
        self._seed = training.set_seed(cfg.seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses

    def _check_config(self, cfg: DictConfig) -> None:
        problems = []  # every problem at once, each with its key, reported without a traceback
        accumulate = self._gradient_accumulation_steps
        if not isinstance(accumulate, int) or accumulate < 1:
            problems.append(config.ConfigProblem("gradient_accumulation_steps", "must be an integer >= 1", accumulate))
        elif self._optimizer_in_bwd:
            try:
                training.OptimizerInBackward.check_compatible(self._clip_grad_norm, accumulate)
            except ValueError as err:
                problems.append(config.ConfigProblem("optimizer_in_bwd", str(err), True))
        if not isinstance(self._log_every_n_steps, int) or self._log_every_n_steps < 1:
            problems.append(
                config.ConfigProblem("log_every_n_steps", "must be an integer >= 1", self._log_every_n_steps)
            )
        for key in ("save_every_n_steps", "run_val_every_n_steps", "max_validation_steps"):
            value = cfg.get(key, None)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(config.ConfigProblem(key, "must be a positive integer, or null to turn it off", value))
        if self._run_val_every_n_steps is not None and cfg.get("dataset_val", None) is None:
            problems.append(config.ConfigProblem("dataset_val", "is missing: run_val_every_n_steps needs a dataset"))
        problems += self._check_extensions(cfg)
        if problems:
            raise config.ConfigError(problems)

    def _check_extensions(self, cfg: DictConfig) -> list[config.ConfigProblem]:
        # model_converters and finetuning_schedule are checked before anything is loaded or built; the schedule
        # object is made here (its constructor checks the phases) and set up once the optimizer exists
        problems = []
        converters = cfg.get("model_converters", None) or []
        try:  # the order rule is checked on the converter classes
            training.validate_converter_order([
                config.get_component_from_path(c.get("_component_"), f"model_converters[{i}]._component_")
                for i, c in enumerate(converters)
            ])
        except config.ConfigError as err:
            problems += err.problems
        except (TypeError, ValueError) as err:
            problems.append(config.ConfigProblem("model_converters", str(err)))
        self._finetuning_schedule = None
        if cfg.get("finetuning_schedule", None) is not None:
            if self._optimizer_in_bwd:
                problems.append(config.ConfigProblem(
                    "finetuning_schedule",
                    "cannot be combined with optimizer_in_bwd: True (the per-parameter optimizers of optimizer_in_bwd "
                    "cannot take the param groups that later phases add). Set optimizer_in_bwd: False",
                ))
            try:
                self._finetuning_schedule = training.FinetuningSchedule(
                    cfg.finetuning_schedule, cfg.get("finetuning_schedule_auto_transition", None)
                )
            except ValueError as err:
                problems.append(config.ConfigProblem("finetuning_schedule", str(err)))
        return problems

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the model weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``; when resuming also the optimizer, LR
            scheduler, progress, data-loader position and RNG states (see ``tune.training.checkpointing``).
        """
        extra = {"resume_from_checkpoint": self._resume}
        if self._keep_last_n_checkpoints is not None:
            extra["keep_last_n_checkpoints"] = self._keep_last_n_checkpoints
        self._checkpointer = config.instantiate(cfg_checkpointer, **extra)
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: the model in its input format, the config and, unless this
        is the last step of the run, ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        training.check_loss_is_finite(self._loss_since_log, self.global_step)  # never save diverged weights
        intermediate = self.global_step < self._total_steps
        state = {training.MODEL_KEY: self._model.state_dict()}
        if intermediate:
            state.update(self._recipe_state(epoch))
        self._checkpointer.save_checkpoint(
            state, epoch=self.epochs_run, step=self.global_step, intermediate_checkpoint=intermediate, config=self._cfg
        )

    def _recipe_state(self, epoch: int) -> dict[str, Any]:
        steps_in_epoch = self.global_step - epoch * self._steps_per_epoch
        samples_per_step = self._gradient_accumulation_steps * self._batch_size
        state = {
            training.OPT_KEY: self._optimizer.state_dict(),
            training.LR_SCHEDULER_KEY: self._lr_scheduler.state_dict() if self._lr_scheduler is not None else None,
            training.SEED_KEY: self._seed,
            training.EPOCHS_KEY: self.epochs_run,
            training.TOTAL_EPOCHS_KEY: self._epochs,
            training.MAX_STEPS_KEY: self._max_steps_per_epoch,
            training.STEPS_KEY: self.global_step,
            training.DATALOADER_KEY: self._sampler.state_dict(num_consumed=steps_in_epoch * samples_per_step),
        }
        if self._finetuning_schedule is not None:
            state["finetuning_schedule"] = self._finetuning_schedule.state_dict()
        return state

    def _restore_recipe_state(self, ckpt: dict[str, Any]) -> None:
        if ckpt[training.SEED_KEY] != self._seed or ckpt[training.MAX_STEPS_KEY] != self._max_steps_per_epoch:
            log.warning(
                "Resuming with seed=%s, max_steps_per_epoch=%s but the checkpoint was written with %s, %s: the "
                "resumed run will not see the data an uninterrupted run would.",
                self._seed, self._max_steps_per_epoch, ckpt[training.SEED_KEY], ckpt[training.MAX_STEPS_KEY],
            )
        if self._finetuning_schedule is not None and ckpt.get("finetuning_schedule") is not None:
            # before the optimizer's state: the phase's param groups must exist for it to load into
            for line in self._finetuning_schedule.load_state_dict(ckpt["finetuning_schedule"]):
                log.info(line)
        self._optimizer.load_state_dict(ckpt[training.OPT_KEY])
        if self._lr_scheduler is not None and ckpt[training.LR_SCHEDULER_KEY] is not None:
            self._lr_scheduler.load_state_dict(ckpt[training.LR_SCHEDULER_KEY])
        self._sampler.load_state_dict(ckpt[training.DATALOADER_KEY])
        self.epochs_run, self.global_step = ckpt[training.EPOCHS_KEY], ckpt[training.STEPS_KEY]
        set_rng_state(ckpt[training.RNG_KEY])  # last: setup drew random numbers that the uninterrupted run did not
        log.info("Resumed after %d optimizer steps (%d epochs complete).", self.global_step, self.epochs_run)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.get("keep_last_n_checkpoints", None)
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model_converters = config.instantiate(cfg.get("model_converters", None)) or []
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY])
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._optimizer = self._setup_optimizer(cfg.optimizer)
        training.register_post_optimizer_hooks(self._optimizer, self._model, self._model_converters)
        self._loss_fn = self._setup_loss(cfg.loss)
        self._batch_size = cfg.batch_size
        collate_cfg = cfg.get("collate_fn", None)  # ours: a function path or a collator class with kwargs
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, collate_cfg)
        self._val_dataloader = None
        if cfg.get("dataset_val", None) is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, collate_cfg, drop_last=False
            )
        batches_per_epoch = len(self._dataloader) // self._gradient_accumulation_steps
        self._steps_per_epoch = batches_per_epoch
        if self._max_steps_per_epoch is not None:
            self._steps_per_epoch = min(batches_per_epoch, self._max_steps_per_epoch)
        if self._steps_per_epoch < 1:
            raise config.ConfigError(config.ConfigProblem(
                "batch_size",
                f"the dataset gives {len(self._dataloader)} full batches, fewer than gradient_accumulation_steps="
                f"{self._gradient_accumulation_steps}: not one optimizer step per epoch. Lower batch_size or "
                "gradient_accumulation_steps, or use more data",
                cfg.batch_size,
            ))
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = self._setup_lr_scheduler(cfg.get("lr_scheduler", None))
        self._setup_finetuning_schedule()
        self._profiler = self._setup_profiler(cfg.get("profiler", None))
        if self._resume:
            self._restore_recipe_state(ckpt)
        config.save_config(cfg, self._output_dir)

    def _setup_model(self, cfg_model: DictConfig, model_state_dict: dict[str, Any]) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        model.load_state_dict(model_state_dict)
        model = self._apply_model_converters(model)
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = self._activation_offloading_ctx()
        num_params = sum(p.numel() for p in model.parameters())
        log.info("Model: %s parameters in %s on %s.", f"{num_params:,}", self._dtype, self._device)
        return model

    def _apply_model_converters(self, model: nn.Module) -> nn.Module:
        # on the loaded model, before the optimizer exists; the schedule's patterns are then checked against it
        try:
            model = training.apply_model_converters(model, self._model_converters)
        except ValueError as err:
            raise config.ConfigError(config.ConfigProblem("model_converters", str(err))) from err
        if self._finetuning_schedule is not None:
            try:
                self._finetuning_schedule.validate(model)
            except ValueError as err:
                raise config.ConfigError(config.ConfigProblem("finetuning_schedule", str(err))) from err
        return model

    def _activation_offloading_ctx(self) -> contextlib.AbstractContextManager:
        if not self._enable_activation_offloading:
            return contextlib.nullcontext()
        supported, reason = training.activation_offloading_supported(self._device)
        if not supported:
            log.warning("enable_activation_offloading=True is ignored: %s", reason)
            return contextlib.nullcontext()
        return training.OffloadActivations()

    def _setup_optimizer(self, cfg_optimizer: DictConfig) -> torch.optim.Optimizer:
        if self._optimizer_in_bwd:
            # one optimizer per parameter, stepped by a hook as soon as that parameter's gradient is ready
            factory = partial(config.instantiate, cfg_optimizer)
            return training.OptimizerInBackward(self._model.named_parameters(), factory)
        return config.instantiate(cfg_optimizer, self._model.parameters())

    def _setup_finetuning_schedule(self) -> None:
        if self._finetuning_schedule is None:
            return
        try:  # freezes every parameter outside phase 0 and takes it out of the optimizer
            lines = self._finetuning_schedule.setup(self._model, self._optimizer, self._lr_scheduler)
        except ValueError as err:
            raise config.ConfigError(config.ConfigProblem("finetuning_schedule", str(err))) from err
        for line in lines:
            log.info(line)

    def _setup_loss(self, cfg_loss: DictConfig) -> nn.Module:
        loss_fn = config.instantiate(cfg_loss)
        if isinstance(loss_fn, CEWithChunkedOutputLoss) and hasattr(self._model, "skip_output_layer"):
            # the same sum of token losses, but the output projection runs inside the loss one chunk at a time,
            # so full [tokens, vocab] logits never exist (torchtune configs name CEWithChunkedOutputLoss)
            loss_fn = LinearCrossEntropyLoss(loss_fn.num_output_chunks, loss_fn.ignore_index, loss_fn.reduction)
            log.info("loss: CEWithChunkedOutputLoss runs as LinearCrossEntropyLoss (same values, no full logits).")
        if hasattr(loss_fn, "set_model_output"):
            loss_fn.set_model_output(self._model)  # the model now returns hidden states; the loss projects them
        if self._compile:
            training.compile_loss(loss_fn)
        return loss_fn

    def _setup_data(
        self, cfg_dataset: DictConfig, shuffle: bool, batch_size: int, cfg_collate: Any, drop_last: bool = True
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate(cfg_dataset, self._tokenizer)
        if cfg_collate is None:
            pad_id = self._tokenizer.pad_id
            packed = cfg_dataset.get("packed", False)
            collate = padded_collate_packed
            if not packed:
                collate = partial(padded_collate_sft, padding_idx=pad_id, ignore_idx=CROSS_ENTROPY_IGNORE_IDX)
            if self._device.type == "cpu":
                # on CPU the samples (or the packs' documents) go end to end in one row: same loss and gradients,
                # no compute on padding
                collate = partial(
                    padding_free_collate,
                    padding_idx=pad_id,
                    ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
                    max_seq_len=getattr(self._model, "max_seq_len", None),
                )
                padded = "padded_collate_packed" if packed else "padded_collate_sft"
                log.info(
                    "CPU: each batch is one padding-free row (tune.data.padding_free_collate); "
                    f"collate_fn=tune.data.{padded} gives padded batches instead."
                )
        elif isinstance(cfg_collate, str):  # a function named by its dotted path, as in torchtune configs
            collate = config.get_component_from_path(cfg_collate)
            params = inspect.signature(collate).parameters
            known = {"padding_idx": self._tokenizer.pad_id, "ignore_idx": CROSS_ENTROPY_IGNORE_IDX}
            collate = partial(collate, **{k: v for k, v in known.items() if k in params})
        else:
            collate = config.instantiate(cfg_collate)  # a collator class configured by keyword arguments
        sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=self._seed)
        # training drops the ragged last batch: every step sees full batches, and a resumed run counts the same
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate,
            drop_last=drop_last,
            pin_memory=self._device.type == "cuda",
        )
        log.info("Dataset %s: %d samples, %d batches.", cfg_dataset._component_, len(dataset), len(loader))
        return sampler, loader

    def _setup_lr_scheduler(self, cfg_lr_scheduler: DictConfig | None) -> Any:
        if cfg_lr_scheduler is None:
            return None
        # schedules that need the run length get it; a user's scheduler without that argument does not
        params = inspect.signature(config.get_component_from_path(cfg_lr_scheduler._component_)).parameters
        extra = {}
        if "num_training_steps" in params and "num_training_steps" not in cfg_lr_scheduler:
            extra["num_training_steps"] = self._total_steps
        return config.instantiate(cfg_lr_scheduler, self._optimizer, **extra)

    def _setup_profiler(self, cfg_profiler: DictConfig | None) -> Any:
        if cfg_profiler is None:
            return training.DummyProfiler()
        return config.instantiate(cfg_profiler)

    # ---------------------------------------------------------------------------------------------------- train

    def loss_step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Forward pass and loss of one micro-batch. Override this in a copied recipe to change the objective.

        Args:
            batch (dict[str, torch.Tensor]): ``tokens`` and ``labels`` [b, s] (labels not shifted), plus ``mask``
                [b, s, s] and ``input_pos`` [b, s] for packed batches; already on the device.

        Returns:
            tuple[torch.Tensor, dict[str, Any]]: the SUM of the token losses of this micro-batch (the loop divides
            by the loss tokens of the whole step), and auxiliary metrics to log (tensors are fine: they are read
            only at logging steps).
        """
        labels = shift_labels(batch["labels"], CROSS_ENTROPY_IGNORE_IDX)
        outputs = self._model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
        return self._loss_fn(outputs, labels), {}

    def train(self) -> None:
        """Runs the epochs: accumulate, clip, step, log, validate and save. Stops on a non-finite loss."""
        device = self._device
        self._loss_since_log.zero_()
        steps_since_log, throughput = 0, training.ThroughputTracker()
        self._optimizer.zero_grad(set_to_none=True)
        self._profiler.start()
        for epoch in range(self.epochs_run, self._epochs):
            self._sampler.set_epoch(epoch)  # on resume the sampler skips what the first run consumed
            steps_done = self.global_step - epoch * self._steps_per_epoch
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # counted on the CPU batches before they move to the device: no host-device sync
                loss_scale = training.step_loss_scale(
                    sum(training.num_loss_tokens(shift_labels(b["labels"])) for b in micro_batches)
                )
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch in micro_batches:
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                    with self._activations_ctx:
                        loss_sum, aux_metrics = self.loss_step(batch)
                    loss = loss_sum * loss_scale  # the step's mean over all of its loss tokens
                    loss.backward()
                    step_loss += loss.detach()
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    mean_loss = self._loss_since_log / steps_since_log
                    metrics = {"loss": training.check_loss_is_finite(mean_loss, self.global_step)}
                    metrics.update(self._step_metrics(grad_norm, throughput.compute(), aux_metrics, optimizer_metrics))
                    self._metric_logger.log_dict(metrics, step=self.global_step)
                    pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {metrics['loss']:.4f}")
                    pbar.set_postfix(tokens_per_second=f"{metrics['tokens_per_second']:.0f}")
                    self._loss_since_log.zero_()
                    steps_since_log = 0
                val_loss = None
                if self._run_val_every_n_steps and self.global_step % self._run_val_every_n_steps == 0:
                    val_loss = self._validate()
                    throughput.reset()  # validation time is not training throughput
                end_of_epoch = self.global_step == (epoch + 1) * self._steps_per_epoch
                if end_of_epoch:
                    self.epochs_run = epoch + 1
                if self._finetuning_schedule is not None:  # the next phase may begin: new params join the optimizer
                    for line in self._finetuning_schedule.step(self.global_step, self.epochs_run, val_loss) or []:
                        log.info(line)
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _optimizer_step(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        grad_norm = None
        if not self._optimizer_in_bwd:  # with optimizer_in_bwd the gradients are already applied and freed
            grad_norm = training.clip_grad_norm(self._model.parameters(), self._clip_grad_norm)
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _step_metrics(self, grad_norm: torch.Tensor | None, throughput: dict[str, float], *extra: dict) -> dict:
        # called at logging steps only: reading tensors here is the loop's one host-device sync
        metrics = {"lr": training.get_lr(self._optimizer), "tokens_per_second": throughput["tokens_per_second"]}
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm.item()
        for more in extra:
            metrics.update({k: v.item() if torch.is_tensor(v) else v for k, v in more.items()})
        if self._log_peak_memory_stats:
            metrics.update(training.get_memory_stats(self._device))
        return metrics

    @torch.no_grad()
    def _validate(self) -> float:
        self._model.eval()
        total_loss = torch.zeros((), dtype=torch.float32, device=self._device)
        total_tokens = torch.zeros((), dtype=torch.int64)
        for i, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and i >= self._max_validation_steps:
                break
            total_tokens += training.num_loss_tokens(shift_labels(batch["labels"]))
            loss_sum, _ = self.loss_step({k: v.to(self._device) for k, v in batch.items()})
            total_loss += loss_sum
        self._model.train()
        val_loss = total_loss.item() / max(int(total_tokens), 1)
        self._metric_logger.log_dict({"val_loss": val_loss}, step=self.global_step)
        log.info("Step %d: validation loss %.4f over %d tokens.", self.global_step, val_loss, int(total_tokens))
        return val_loss

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run full_finetune_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="FullFinetuneRecipeSingleDevice", cfg=cfg)
    recipe = FullFinetuneRecipeSingleDevice(cfg)
    recipe.setup(cfg)
    try:
        recipe.train()
    except training.NonFiniteLossError as err:  # a diverged run is a result, not a crash: no traceback
        log.error(str(err))
        raise SystemExit(1) from None
    finally:
        recipe.cleanup()


if __name__ == "__main__":
    sys.exit(recipe_main())
