"""Kahneman-Tversky Optimization (KTO) of a language model on one device (CPU, one GPU or Apple MPS).

Trains on unpaired feedback: each example is a prompt, one completion and whether that completion is desirable
(``tune.datasets.unpaired_preference_dataset``, or ``tune.datasets.unpaired_from_pairs`` for preference pairs), with
``tune.rlhf.loss.KTOLoss`` (``loss_type`` kto or apo_zero_unpaired) on summed completion log-probabilities.

LoRA or full fine-tuning, as the model builder says. With LoRA adapters the reference model is the policy with its
adapters disabled (``tune.modules.peft.disable_adapter``): no second copy of the weights. A model without adapters
is trained in full and the reference is a frozen copy of the starting weights, held on the training device: twice
the weights' memory (plus the optimizer state of the policy); a resumed run reads that copy from the starting
checkpoint again.

The KL estimate ``z0`` of a step is the mean, over the KL rows of all its micro-batches, of the policy's minus the
reference's log-probabilities of the mismatched (prompt, completion) rows the dataset builds (``kl_group_size``),
scored without gradients before the step's loss, detached and clamped at 0. The loss of a step is the mean of the
weighted per-example losses over all of its examples. With one micro-batch per step, ``kl_group_size`` equal to
``batch_size`` and no shuffling this is TRL's ``KTOTrainer``. The metrics carry TRL's names (``kl``,
``rewards/chosen``, ``logps/rejected``, ``logits/chosen``, ...); validation also logs ``val_desirable_rate``
(``tune.rlhf.DesirableRate``). Outputs are those of ``lora_finetune_single_device`` (the adapter in the PEFT format
and the merged model) or ``full_finetune_single_device``.

The file reads top to bottom: ``__init__`` reads and checks the config, ``setup`` builds the pieces, ``train`` holds
the loop, ``kl_estimate`` and ``loss_step`` compute the KL term of a step and the loss of one micro-batch,
``save_checkpoint`` writes ``output_dir/step_N/``.

    tune run kto_single_device --config qwen3/1.7B_lora_kto_single_device
    tune cp kto_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import sys
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.peft import disable_adapter, get_adapter_params
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["*/*_kto_single_device"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "kto"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "an example comes with its KL row; unpaired examples are not packed",
    "model_converters": "build the model with a lora_* builder (LoRA) or the full builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "optimizer_in_bwd": "the KL rows are scored before the step's backward passes; use a regular optimizer",
}

log = utils.get_logger(name="tune.recipes.kto_single_device")


class KTORecipeSingleDevice:
    """KTO (LoRA/QLoRA/DoRA or full) on one device; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is the mean over all examples of the step, the KL estimate over all of
    its KL rows), gradient clipping, any optimizer and LR scheduler by ``_component_``, activation checkpointing and
    offloading, ``compile``, fp32/bf16, validation every N steps, step and epoch checkpoints with exact mid-epoch
    resume, metric loggers, a progress bar and the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_kto_single_device.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg, unsupported=UNSUPPORTED, tables=RECIPE_INFO["optional_keys"])
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu" and training.configure_cpu_allocator():
            log.info("CPU: malloc keeps freed blocks for the next step (TUNE_CPU_ALLOCATOR=0 turns this off).")
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._compile = cfg.compile
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._save_every_n_steps = cfg.save_every_n_steps
        self._run_val_every_n_steps = cfg.run_val_every_n_steps
        self._max_validation_steps = cfg.max_validation_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._seed = training.set_seed(cfg.seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        self._loss_check = training.FiniteLossCheck(self._device)
        self._metrics = rlhf.KTOMetrics(self._device)  # rewards, log-probs, logits and KL since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the model weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``; when resuming also the adapter, optimizer,
            LR scheduler, progress, data-loader position and RNG states (see ``tune.training.checkpointing``).
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=self._resume, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: for LoRA the adapter in the PEFT format and the merged model
        (unless ``save_adapter_weights_only``), else the model, in its input format; the config and, unless this is
        the last step of the run, ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, reference, tokenizer, optimizer, loss, data, LR scheduler, profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        # LoRA: the policy with its adapters disabled; full: a frozen copy of the starting weights
        self._reference = None if self._adapter_config is not None else self._setup_reference(cfg, ckpt)
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._trainable_params())
        self._loss_fn = config.instantiate(cfg.loss)
        self._needs_kl = getattr(self._loss_fn, "needs_kl", True)
        log.info(
            "Loss: %s (%s; %s).",
            config.component_name(cfg.loss),
            "KL estimate from the dataset's KL rows" if self._needs_kl else "no KL estimate",
            "reference: the model with adapters disabled" if self._reference is None else "reference: a frozen copy",
        )
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        self._val_dataloader = None
        if cfg.dataset_val is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, cfg.collate_fn, drop_last=False
            )
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), self._gradient_accumulation_steps, self._max_steps_per_epoch
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, self._total_steps)
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        self._recipe_state = config.recipe_state(  # what a save writes and a resume restores
            cfg,
            self._model,
            self._optimizer,
            checkpointer=self._checkpointer,
            sampler=self._sampler,
            seed=self._seed,
            steps_per_epoch=self._steps_per_epoch,
            lr_scheduler=self._lr_scheduler,
            adapter_config=self._adapter_config,
        )
        if self._resume:
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(ckpt, cfg.seed, log)
        config.save_config(cfg, self._output_dir)

    def _setup_model(
        self, cfg_model: DictConfig, base_state_dict: dict[str, Any], adapter_state_dict: dict[str, Any] | None
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        self._adapter_config = None
        if get_adapter_params(model):  # LoRA: only the adapters learn
            training.load_lora_state_dicts(model, base_state_dict)  # then DoRA magnitudes from the loaded weights
            with config.errors_at("model._component_", cfg_model._component_):
                _, self._adapter_config = training.prepare_lora_model(model, model_converters=False)
            if adapter_state_dict is not None:  # resuming, or continuing from a saved adapter
                training.load_lora_state_dicts(model, adapter_state_dict=adapter_state_dict)
        else:  # full fine-tuning
            model.load_state_dict(base_state_dict)
        # the policy and the reference must score a sequence the same way, with and without gradients
        training.disable_dropout(model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())
        num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info(
            "Model: %s parameters, %s of them trainable (%s), in %s on %s.",
            f"{num_params:,}",
            f"{num_trainable:,}",
            "LoRA" if self._adapter_config is not None else "full fine-tuning",
            self._dtype,
            self._device,
        )
        return model

    def _setup_reference(self, cfg: DictConfig, ckpt: dict[str, Any]) -> nn.Module:
        """The frozen reference of a full fine-tune: the starting weights (read again from ``checkpoint_dir`` when
        resuming, as the resumed policy has moved away from them)."""
        state_dict = ckpt[training.MODEL_KEY]
        if self._resume:
            starting = config.instantiate_checkpointer(
                cfg.checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=None
            )
            state_dict = starting.load_checkpoint()[training.MODEL_KEY]
        with training.set_default_dtype(self._dtype), self._device:
            reference = config.instantiate(cfg.model)
        reference.load_state_dict(state_dict)
        reference.requires_grad_(False)
        training.disable_dropout(reference)
        if self._compile:
            training.compile_model(reference)
        log.info("Reference: a frozen copy of the starting weights (the memory of a second model).")
        return reference.eval()

    def _setup_data(
        self,
        cfg_dataset: DictConfig | ListConfig,
        shuffle: bool,
        batch_size: int,
        cfg_collate: Any,
        drop_last: bool = True,
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate_dataset(cfg_dataset, self._tokenizer)  # a list is concatenated
        with config.errors_at("dataset", config.component_name(cfg_dataset)):
            rlhf.check_unpaired_dataset(dataset, needs_kl=self._needs_kl)
        collate = config.instantiate_collate(
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            device_type=self._device.type,
        )
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
        log.info("Dataset %s: %d examples, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
        return sampler, loader

    # ---------------------------------------------------------------------------------------------------- train

    def _reference_log_probs(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The reference's summed log-probabilities of the rows' completions [b], without gradients."""
        with torch.no_grad():
            if self._reference is not None:
                return rlhf.model_sequence_log_probs(self._reference, tokens, labels).log_probs
            with disable_adapter(self._model):  # the policy with its adapters (its output layer's too) disabled
                return rlhf.model_sequence_log_probs(self._model, tokens, labels).log_probs

    @torch.no_grad()
    def kl_estimate(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """KTO's reference point ``z0`` for one optimizer step: the mean over the KL rows of all its micro-batches of
        ``log pi(y'|x) - log pi_ref(y'|x)``, clamped at 0. Scored before the step's loss, with the weights the loss
        sees. A distributed recipe all-reduces the sum and the count before dividing.

        Args:
            micro_batches (list[dict[str, torch.Tensor]]): the step's batches (``kl_tokens``, ``kl_labels``).

        Returns:
            torch.Tensor: 0-d, detached, ``>= 0``.
        """
        log_ratio_sum = torch.zeros((), dtype=torch.float32, device=self._device)
        num_rows = 0
        for batch in micro_batches:
            tokens, labels = batch["kl_tokens"].to(self._device), batch["kl_labels"].to(self._device)
            policy = rlhf.model_sequence_log_probs(self._model, tokens, labels).log_probs
            log_ratio_sum += (policy - self._reference_log_probs(tokens, labels)).float().sum()
            num_rows += tokens.shape[0]
        return rlhf.loss.kto_kl_estimate(log_ratio_sum, num_rows)

    def loss_step(
        self,
        batch: dict[str, torch.Tensor],
        kl: torch.Tensor | None,
        metrics: rlhf.KTOMetrics,
        desirable_rate: rlhf.DesirableRate | None = None,
    ) -> torch.Tensor:
        """Forward passes and loss of one micro-batch of examples. Override this in a copied recipe to change the
        objective.

        Args:
            batch (dict[str, torch.Tensor]): ``tokens``, ``labels`` [b, s] (labels ``-100`` outside the completions,
                not shifted) and ``desirable`` [b]; already on the device.
            kl (torch.Tensor | None): the step's KL estimate (:meth:`kl_estimate`); None for a loss without one.
            metrics (rlhf.KTOMetrics): where the rewards, log-probabilities and logits go.
            desirable_rate (rlhf.DesirableRate | None): validation: where the policy's log-probabilities go.

        Returns:
            torch.Tensor: the SUM of the weighted per-example losses (the loop divides by the examples of the step).
        """
        tokens, labels, desirable = batch["tokens"], batch["labels"], batch["desirable"]
        reference = self._reference_log_probs(tokens, labels)
        with self._activations_ctx:  # only the completion positions are projected onto the vocabulary
            scores = rlhf.model_sequence_log_probs(self._model, tokens, labels)
        losses, rewards = self._loss_fn(scores.log_probs, reference, desirable, kl)
        metrics.update(rewards, scores.log_probs, desirable, scores.logit_sums, scores.num_tokens)
        if desirable_rate is not None:
            desirable_rate.update(tokens, labels, scores.log_probs, desirable)
        return losses.sum()

    def train(self) -> None:
        """Runs the epochs: KL estimate, accumulate, clip, step, log, validate and save. Stops on a non-finite
        loss."""
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
                # every example of the step weighs the same: the loss is their mean (counted on the CPU batches)
                loss_scale = self._loss_tokens.step_loss_scale(
                    sum(batch["tokens"].shape[0] for batch in micro_batches),
                    num_loss_tokens=sum(training.num_loss_tokens(batch["labels"]) for batch in micro_batches),
                )
                kl = None
                if self._needs_kl:  # over every KL row of the step, before the weights it measures change
                    kl = self.kl_estimate(micro_batches)
                    self._metrics.update_kl(kl)
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
                    loss = self.loss_step(batch, kl, self._metrics) * loss_scale  # this micro-batch's share
                    step_loss += loss.detach()
                    if batch_index == self._gradient_accumulation_steps - 1:  # the step's loss, read once
                        self._loss_check.record(step_loss)  # backward is queued, before the optimizer step
                    loss.backward()
                self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=self._loss_since_log.item() / steps_since_log,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(self._metrics.compute(), optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,
                    )
                    self._metric_logger.log_dict(metrics, step=self.global_step)
                    pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {metrics['loss']:.4f}")
                    if "kl" in metrics:
                        pbar.set_postfix(kl=f"{metrics['kl']:.3f}")
                    self._loss_since_log.zero_()
                    steps_since_log = 0
                if self._run_val_every_n_steps and self.global_step % self._run_val_every_n_steps == 0:
                    self._validate()
                    throughput.reset()  # validation time is not training throughput
                end_of_epoch = self.global_step == (epoch + 1) * self._steps_per_epoch
                if end_of_epoch:
                    self.epochs_run = epoch + 1
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self._loss_tokens.check(epoch, end_of_epoch)  # reads the token counts: a save syncs anyway
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _validate(self) -> None:
        """The mean loss, the metrics and the desirable rate over the held-out examples, logged with a ``val_``
        prefix. Each validation batch is its own KL group: its KL estimate is over its own KL rows."""
        self._model.eval()
        metrics, desirable_rate = rlhf.KTOMetrics(self._device), rlhf.DesirableRate()
        loss_sum = torch.zeros((), dtype=torch.float32, device=self._device)
        num_examples = 0
        for index, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            kl = None
            if self._needs_kl:
                kl = self.kl_estimate([batch])
                metrics.update_kl(kl)
            batch = {key: value.to(self._device) for key, value in batch.items()}
            loss_sum += self.loss_step(batch, kl, metrics, desirable_rate).float()
            num_examples += batch["tokens"].shape[0]
        self._model.train()
        rate, num_comparisons = desirable_rate.compute()
        values = {"val_loss": loss_sum.item() / max(num_examples, 1), "val_desirable_rate": rate}
        values.update({f"val_{name}": value for name, value in metrics.compute().items()})
        self._metric_logger.log_dict(values, step=self.global_step)
        log.info(
            "Step %d: validation loss %.4f over %d examples, desirable rate %.3f over %d same-prompt comparisons.",
            self.global_step,
            values["val_loss"],
            num_examples,
            rate,
            num_comparisons,
        )

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run kto_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="KTORecipeSingleDevice", cfg=cfg)
    recipe = KTORecipeSingleDevice(cfg)
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
