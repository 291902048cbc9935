"""Reward-model training on preference pairs, on one device (CPU, one GPU or Apple MPS).

A sequence classifier with one output (``tune.models.classifier_model`` around any text family's decoder, or a
family's ``*_classifier`` builder) learns to score a chosen response above the rejected one: the Bradley-Terry loss
of ``tune.rlhf.loss.RewardModelLoss`` (with an optional per-pair margin from the dataset and TRL's reward centering).
A sequence's reward is the score at its last non-padding token, as transformers' ``*ForSequenceClassification``
models read it. On CPU a batch's sequences are laid end to end in one row without padding (the default there,
``tune.data.padding_free_collate_dpo``; elsewhere ``tune.data.padded_collate_dpo``), with the same rewards.
The model builder decides what trains: a ``lora_*`` base trains its adapters and the score head, any other base trains
every weight. The loss of a step is the mean over all of its pairs (every micro-batch); the metrics
carry TRL's ``RewardTrainer`` names (``accuracy``, ``margin``, ``min_reward``, ``mean_reward``, ``max_reward``), and
validation logs ``val_loss`` and ``val_accuracy``, the held-out pair accuracy. Starting from a causal language
model, every checkpoint is a ``<Family>ForSequenceClassification`` model that transformers loads with
``AutoModelForSequenceClassification`` and ``ppo_full_finetune_single_device`` reads as its reward model
(``model_type: REWARD``); a LoRA run also writes a PEFT ``SEQ_CLS`` adapter that carries the head.

The file reads top to bottom: ``__init__`` reads and checks the config, ``setup`` builds the pieces, ``train``
holds the loop, ``loss_step`` computes the loss of one micro-batch of pairs, ``save_checkpoint`` writes
``output_dir/step_N/``.

    tune run reward_model_single_device --config llama3_2/1B_lora_reward_single_device
    tune cp reward_model_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import sys
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, data, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.peft import get_adapter_params
from tune.rlhf.loss import RewardMetrics
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["*/*_reward_single_device", "demo/reward*"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "reward"],
}

# settings of the "finetune" and "lora" tables this recipe does not support, with the reason
UNSUPPORTED = {
    "dataset.packed": "a chosen and a rejected sequence form one sample; preference pairs are not packed",
    "model_converters": "build the model with tune.models.classifier_model around a lora_* builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "save_adapter_weights_only": "the score head trains in full; the adapter copies it from the saved model",
}

log = utils.get_logger(name="tune.recipes.reward_model_single_device")


class RewardModelRecipeSingleDevice:
    """Reward-model training (LoRA or full) on one device; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is the mean over all pairs of the step), gradient clipping, any
    optimizer and LR scheduler by ``_component_``, ``optimizer_in_bwd``, activation checkpointing and offloading,
    ``compile``, fp32/bf16, validation every N steps (loss and pair accuracy on held-out pairs), step and epoch
    checkpoints with exact mid-epoch resume, metric loggers, a progress bar and the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_reward_single_device.yaml``).

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
        self._optimizer_in_bwd = cfg.optimizer_in_bwd
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
        self._metrics = RewardMetrics(self._device)  # accuracy, margin and rewards since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer, which reads and writes the model as a sequence classifier, and reads the model
        weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY`` (a causal LM's head as ``output.weight``,
            replaced by the classifier's); when resuming also the adapter (with the score head), optimizer, LR
            scheduler, progress, data-loader position and RNG states.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=self._resume, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        with config.errors_at("checkpointer._component_", cfg_checkpointer._component_):
            self._checkpointer.as_sequence_classifier(pad_token_id=self._tokenizer.pad_id)
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: the model as a ``*ForSequenceClassification`` checkpoint (for
        LoRA the merged model and the PEFT adapter with the score head), the config and, unless this is the last
        step of the run, ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, tokenizer, model, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        self._tokenizer = config.instantiate(cfg.tokenizer)  # its pad id finds each sequence's last token
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = self._setup_optimizer(cfg.optimizer)
        self._loss_fn = config.instantiate(cfg.loss)
        log.info("Loss: %s.", config.component_name(cfg.loss))
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
        head = getattr(getattr(model, "output", None), "weight", None)
        if head is None or head.shape[0] != 1:
            raise config.ConfigError(
                [
                    config.ConfigProblem(
                        "model._component_",
                        "builds a model without a one-output head; a reward model scores each sequence with one "
                        "number. Wrap the family's builder: {_component_: tune.models.classifier_model, num_classes: "
                        "1, base: {_component_: ...}}",
                        cfg_model._component_,
                    )
                ]
            )
        # a causal LM's vocabulary head gives way to the classifier's fresh one (a classifier's own head is kept)
        training.update_state_dict_for_classifier(base_state_dict, model.named_parameters())
        self._adapter_config = None
        if get_adapter_params(model):  # a LoRA base: its adapters and the score head train
            training.load_lora_state_dicts(model, base_state_dict)
            with config.errors_at("model._component_", cfg_model._component_):
                adapter_params, self._adapter_config = training.prepare_lora_model(model, model_converters=False)
            model.output.weight.requires_grad_(True)
            if adapter_state_dict is not None:  # resuming, or continuing from a saved adapter (with its head)
                training.load_lora_state_dicts(model, adapter_state_dict=adapter_state_dict)
        else:
            model.load_state_dict(base_state_dict)
        training.disable_dropout(model)  # as TRL's RewardTrainer (disable_dropout: true): rewards are deterministic
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())
        num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info(
            "Reward model (%s): %s parameters, %s of them trainable, in %s on %s.",
            "LoRA adapters and score head" if self._adapter_config else "full",
            f"{num_params:,}",
            f"{num_trainable:,}",
            self._dtype,
            self._device,
        )
        return model

    def _setup_optimizer(self, cfg_optimizer: DictConfig) -> torch.optim.Optimizer:
        if self._optimizer_in_bwd:
            # one optimizer per parameter, stepped by a hook as soon as that parameter's gradient is ready
            factory = partial(config.instantiate, cfg_optimizer)
            return training.OptimizerInBackward(self._model.named_parameters(), factory)
        return config.instantiate(cfg_optimizer, self._trainable_params())

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
            rlhf.check_preference_dataset(dataset)  # chosen and rejected sequences, not SFT samples
        # chosen sequences first, then rejected ones (and the margins, if any): padded rows, or one padding-free row
        collate = config.instantiate_collate(
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            max_seq_len=getattr(self._model, "max_seq_len", None),
            device_type=self._device.type,
            pairs=True,
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
        log.info("Dataset %s: %d pairs, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
        return sampler, loader

    # ---------------------------------------------------------------------------------------------------- train

    def loss_step(self, batch: data.PreferenceBatch, metrics: RewardMetrics) -> torch.Tensor:
        """Rewards and loss of one micro-batch of pairs. Override this in a copied recipe to change the objective.

        Args:
            batch (data.PreferenceBatch): the chosen sequences, then the rejected ones: right-padded rows [2b, s]
                or one padding-free row [1, T] with its mask and positions (the labels are not used), and the
                pairs' margins [b] when the dataset has a margin column; already on the device.
            metrics (RewardMetrics): where the rewards of the pairs go.

        Returns:
            torch.Tensor: the SUM of the per-pair losses (the loop divides by the pairs of the whole step).
        """
        with self._activations_ctx:  # a score at every position: [2b, s, 1], or [1, T, 1] padding-free
            scores = self._model(batch.tokens, mask=batch.mask, input_pos=batch.input_pos)
        # each sequence's reward: the score at its last non-padding token, as transformers' classifiers pick it
        rows, columns = batch.last_token_positions(self._tokenizer.pad_id)  # [2b] each
        chosen_rewards, rejected_rewards = scores[rows, columns, 0].chunk(2)
        losses = self._loss_fn(chosen_rewards, rejected_rewards, batch.margin)
        metrics.update(chosen_rewards, rejected_rewards)
        return losses.sum()

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
                micro_batches = [data.preference_batch(next(batches)) for _ in range(self._gradient_accumulation_steps)]
                # every pair of the step weighs the same: the loss is their mean (pairs counted on the CPU batches)
                loss_scale = self._loss_tokens.step_loss_scale(sum(batch.num_pairs for batch in micro_batches))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch.tokens, self._tokenizer.pad_id))
                    batch = batch.to(device, non_blocking=True)
                    loss = self.loss_step(batch, self._metrics) * loss_scale  # this micro-batch's share of the mean
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
                    pbar.set_postfix(accuracy=f"{metrics['accuracy']:.2f}")
                    self._loss_since_log.zero_()
                    steps_since_log = 0
                if self._run_val_every_n_steps and self.global_step % self._run_val_every_n_steps == 0:
                    self._validate()
                    throughput.reset()  # validation time is not training throughput
                end_of_epoch = self.global_step == (epoch + 1) * self._steps_per_epoch
                if end_of_epoch:
                    self.epochs_run = epoch + 1
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self._loss_tokens.check(epoch, end_of_epoch)  # reads the counts: a save syncs anyway
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

    @torch.no_grad()
    def _validate(self) -> None:
        """The mean loss and the reward metrics over the held-out pairs, logged with a ``val_`` prefix
        (``val_accuracy``: the share of held-out pairs whose chosen response gets the higher reward)."""
        self._model.eval()
        metrics = RewardMetrics(self._device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self._device)
        num_pairs = 0
        for index, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            batch = data.preference_batch(batch)
            loss_sum += self.loss_step(batch.to(self._device), metrics)
            num_pairs += batch.num_pairs
        self._model.train()
        values = {"val_loss": loss_sum.item() / max(num_pairs, 1)}
        values.update({f"val_{name}": value for name, value in metrics.compute().items()})
        self._metric_logger.log_dict(values, step=self.global_step)
        log.info(
            "Step %d: validation loss %.4f, pair accuracy %.3f over %d pairs.",
            self.global_step,
            values["val_loss"],
            values.get("val_accuracy", float("nan")),
            num_pairs,
        )

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run reward_model_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="RewardModelRecipeSingleDevice", cfg=cfg)
    recipe = RewardModelRecipeSingleDevice(cfg)
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
