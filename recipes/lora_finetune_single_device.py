"""LoRA, QLoRA and DoRA fine-tuning of a language model on one device (CPU, one GPU or Apple MPS).

Which of the three runs is the model builder's choice in the config (``lora_llama3_2_1b``, ``qlora_...``,
``use_dora: True``): this recipe freezes every parameter but the adapters, trains those, and saves them in the
Hugging Face PEFT format (``adapter_model.safetensors`` + ``adapter_config.json``), with the merged model unless
``save_adapter_weights_only: True``. The file reads top to bottom: ``__init__`` reads and checks the config,
``setup`` builds the pieces, ``train`` holds the loop, ``loss_step`` computes the loss of one micro-batch (override
it in a copy of this recipe to change the objective), ``save_checkpoint`` writes ``output_dir/step_N/``.

    tune run lora_finetune_single_device --config llama3_2/1B_lora_single_device
    tune cp lora_finetune_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import sys
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import shift_labels
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": False,
    # [!D]: not the *_KD_lora_single_device configs, which knowledge_distillation_single_device runs
    "configs": ["*/*[!D]_lora_single_device", "*/*_qlora_single_device", "demo/*lora*"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "moe"],
}

log = utils.get_logger(name="tune.recipes.lora_finetune_single_device")


class LoRAFinetuneRecipeSingleDevice:
    """LoRA/QLoRA/DoRA fine-tuning on one device; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is normalised by the non-ignored tokens of the whole step),
    gradient clipping, any optimizer and LR scheduler by ``_component_``, ``optimizer_in_bwd``, activation
    checkpointing and offloading, ``compile``, chunked cross-entropy, fp32/bf16, validation every N steps,
    step and epoch checkpoints with exact mid-epoch resume, metric loggers, a progress bar and the profiler;
    ``model_converters`` (e.g. QAT) and a ``finetuning_schedule`` (gradual unfreezing of the adapters).

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_lora_single_device.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg)  # every problem of the settings at once, before anything is built
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
        self._optimizer_in_bwd = cfg.optimizer_in_bwd
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._save_every_n_steps = cfg.save_every_n_steps
        self._run_val_every_n_steps = cfg.run_val_every_n_steps
        self._max_validation_steps = cfg.max_validation_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._finetuning_schedule = None  # gradual unfreezing: set up once the optimizer exists
        if cfg.finetuning_schedule is not None:
            self._finetuning_schedule = training.FinetuningSchedule(
                cfg.finetuning_schedule, cfg.finetuning_schedule_auto_transition
            )
        self._seed = training.set_seed(cfg.seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        self._loss_check = training.FiniteLossCheck(self._device)

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the model weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``; when resuming also the optimizer, LR
            scheduler, progress, data-loader position and RNG states (see ``tune.training.checkpointing``).
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=self._resume, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: the adapter in the PEFT format, the merged model in its input
        format (unless ``save_adapter_weights_only``), the config and, unless this is the last step of the run,
        ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model_converters = config.instantiate(cfg.model_converters) or []
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = self._setup_optimizer(cfg.optimizer)
        training.register_post_optimizer_hooks(self._optimizer, self._model, self._model_converters)
        self._loss_fn = training.prepare_loss(
            config.instantiate(cfg.loss), self._model, compile=self._compile, reduction="sum"
        )
        # mixture-of-experts models: the load-balancing loss (added when router_aux_loss_coef > 0) and routing
        # metrics; nothing for other models
        self._router_aux_loss = training.RouterAuxLoss(self._model, cfg.router_aux_loss_coef, self._tokenizer.pad_id)
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
        self._setup_finetuning_schedule()
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
            finetuning_schedule=self._finetuning_schedule,
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
        training.load_lora_state_dicts(model, base_state_dict)  # then DoRA magnitudes from the loaded weights
        # on the loaded model: a LoRAConverter puts adapters on a model built without them
        model = self._apply_model_converters(model)
        with config.errors_at("model._component_", cfg_model._component_):  # only the adapters learn
            adapter_params, self._adapter_config = training.prepare_lora_model(
                model, full_recipe="full_finetune_single_device"
            )
        if adapter_state_dict is not None:  # resuming, or continuing from a saved adapter
            training.load_lora_state_dicts(model, adapter_state_dict=adapter_state_dict)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())
        num_trainable = sum(p.numel() for p in adapter_params.values())
        log.info(
            "Model: %s parameters, %s of them trainable adapter weights, in %s on %s.",
            f"{num_params:,}",
            f"{num_trainable:,}",
            self._dtype,
            self._device,
        )
        return model

    def _apply_model_converters(self, model: nn.Module) -> nn.Module:
        # on the loaded model, before the optimizer exists; the schedule's patterns are then checked against it
        with config.errors_at("model_converters"):
            model = training.apply_model_converters(model, self._model_converters)
        if self._finetuning_schedule is not None:
            with config.errors_at("finetuning_schedule"):
                self._finetuning_schedule.validate(model)
        return model

    def _setup_optimizer(self, cfg_optimizer: DictConfig) -> torch.optim.Optimizer:
        if self._optimizer_in_bwd:
            # one optimizer per parameter, stepped by a hook as soon as that parameter's gradient is ready
            factory = partial(config.instantiate, cfg_optimizer)
            return training.OptimizerInBackward(self._model.named_parameters(), factory)
        return config.instantiate(cfg_optimizer, self._trainable_params())

    def _setup_finetuning_schedule(self) -> None:
        if self._finetuning_schedule is None:
            return
        with config.errors_at("finetuning_schedule"):  # freezes every parameter outside phase 0
            lines = self._finetuning_schedule.setup(self._model, self._optimizer, self._lr_scheduler)
        for line in lines:
            log.info(line)

    def _setup_data(
        self,
        cfg_dataset: DictConfig | ListConfig,
        shuffle: bool,
        batch_size: int,
        cfg_collate: Any,
        drop_last: bool = True,
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate_dataset(cfg_dataset, self._tokenizer)  # a list is concatenated
        collate = config.instantiate_collate(  # packed or not is decided from the dataset itself
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            max_seq_len=getattr(self._model, "max_seq_len", None),
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
        log.info("Dataset %s: %d samples, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
        return sampler, loader

    # ---------------------------------------------------------------------------------------------------- train

    def loss_step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Forward pass and loss of one micro-batch. Override this in a copied recipe to change the objective.

        Args:
            batch (dict[str, torch.Tensor]): ``tokens`` and ``labels`` [b, s] (labels not shifted), plus ``mask``
                [b, s, s] and ``input_pos`` [b, s] for packed batches; already on the device.

        Returns:
            tuple[torch.Tensor, dict[str, Any]]: the SUM of the token losses of this micro-batch (for a
            mixture-of-experts model, plus its load-balancing loss: ``tune.training.RouterAuxLoss``; the loop divides
            by the loss tokens of the whole step), and auxiliary metrics to log (tensors are fine: they are read
            only at logging steps).
        """
        labels = shift_labels(batch["labels"], CROSS_ENTROPY_IGNORE_IDX)
        outputs = self._model(batch["tokens"], **training.model_inputs(batch))
        return self._router_aux_loss(self._loss_fn(outputs, labels), batch["tokens"], labels)

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
                loss_scale = self._loss_tokens.step_loss_scale(
                    sum(training.num_loss_tokens(shift_labels(b["labels"])) for b in micro_batches)
                )
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = training.batch_to_device(batch, device)
                    with self._activations_ctx:
                        loss_sum, aux_metrics = self.loss_step(batch)
                    loss = loss_sum * loss_scale  # the step's mean over all of its loss tokens
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
                        extra=(aux_metrics, optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,
                    )
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
                    self._loss_tokens.check(epoch, end_of_epoch)  # reads the token counts: a save syncs anyway
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _optimizer_step(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        grad_norm = None
        if not self._optimizer_in_bwd:  # with optimizer_in_bwd the gradients are already applied and freed
            grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    def _validate(self) -> float:
        self._model.eval()
        val_loss, num_tokens = training.validation_loss(
            self.loss_step, self._val_dataloader, self._device, max_steps=self._max_validation_steps
        )
        self._model.train()
        self._metric_logger.log_dict({"val_loss": val_loss}, step=self.global_step)
        log.info("Step %d: validation loss %.4f over %d tokens.", self.global_step, val_loss, num_tokens)
        return val_loss

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run lora_finetune_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="LoRAFinetuneRecipeSingleDevice", cfg=cfg)
    recipe = LoRAFinetuneRecipeSingleDevice(cfg)
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
