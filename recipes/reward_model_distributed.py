"""Reward-model training on preference pairs on several devices with FSDP2.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 reward_model_distributed --config qwen3/8B_lora_reward
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        reward_model_distributed --config qwen2_5/7B_full_reward

It trains what ``reward_model_single_device`` trains, the same way: a sequence classifier with one output
(``tune.models.classifier_model`` around any text family's decoder) learns to score the chosen response of each pair
above the rejected one with the Bradley-Terry loss of ``tune.rlhf.loss.RewardModelLoss`` (optional per-pair margin,
reward centering); a sequence's reward is the score at its last non-padding token (on CPU the batch's sequences are laid
end to end in one padding-free row by default: ``tune.data.padding_free_collate_dpo``). A ``lora_*`` base trains its
adapters and the score head, any other base every weight. The model is built on the meta device and sharded with
``fully_shard`` per transformer layer and on the root, each rank loading only its shards of the checkpoint; the
adapters and, from a causal language model, the fresh score head are drawn from one seed on every rank.
``batch_size`` is pairs per rank; the loss of a step is the mean over the pairs of all ranks and micro-batches (N
ranks with batch b train exactly like one device with batch N*b), and the metrics under TRL's names (``accuracy``,
``margin``, ``min_reward``, ``mean_reward``, ``max_reward``; ``val_loss`` and ``val_accuracy`` on held-out pairs) are
taken over the same pairs. Checkpoints: a ``<Family>ForSequenceClassification`` model (for LoRA the merged model and
a PEFT ``SEQ_CLS`` adapter carrying the head), gathered to rank 0 (``output_dir/step_N/``), and the sharded trainable
weights, optimizer and progress for resuming (``output_dir/dcp/step_N/``). The file keeps the structure of
``lora_dpo_distributed.py`` (the wiring) and the ``loss_step`` of ``reward_model_single_device.py`` (the math).
"""

import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, data, models, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.peft import get_adapter_params
from tune.rlhf.loss import RewardMetrics
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_reward"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "distributed", "reward"],
}

# settings of the optional tables this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "a chosen and a rejected sequence form one sample; preference pairs are not packed",
    "model_converters": "build the model with tune.models.classifier_model around a lora_* builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "save_adapter_weights_only": "the score head trains in full; the adapter copies it from the saved model",
    "tensor_parallel_dim": config.KeepDefault(
        "this recipe shards the reward model with FSDP2 only; fsdp_cpu_offload: True where it does not fit"
    ),
    "context_parallel_dim": config.KeepDefault(
        "a reward is read at each sequence's last token, which one rank holds; shorten max_seq_len instead"
    ),
}

log = utils.get_logger(name="tune.recipes.reward_model_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class RewardModelRecipeDistributed:
    """Reward-model training (LoRA or full) with FSDP2; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``reward_model_single_device`` supports except ``optimizer_in_bwd``: gradient accumulation (the
    loss is the mean over all pairs of the step on all ranks), clipping, any optimizer and LR scheduler by
    ``_component_``, activation checkpointing and offloading, ``compile``, fp32/bf16 (and FSDP mixed precision),
    validation (loss and pair accuracy over the held-out pairs of all ranks), step and epoch checkpoints with exact
    mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler. Adds ``fsdp_cpu_offload``,
    ``fsdp_reshard_after_forward`` and ``dist_backend``; ``tensor_parallel_dim`` and ``context_parallel_dim`` must
    be 1.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_reward.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(  # every problem at once
            cfg, distributed=True, unsupported=UNSUPPORTED, tables=RECIPE_INFO["optional_keys"]
        )
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu":
            training.configure_cpu_allocator()  # freed activations stay in the heap for the next step
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._compile = cfg.compile
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._fsdp_cpu_offload = cfg.fsdp_cpu_offload
        self._save_every_n_steps = cfg.save_every_n_steps
        self._run_val_every_n_steps = cfg.run_val_every_n_steps
        self._max_validation_steps = cfg.max_validation_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._dims = config.init_parallel(cfg, self._device)  # process group and device meshes
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)
        self._metrics = RewardMetrics(self._device)  # this rank's accuracy, margin and rewards since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer, which reads and writes the model as a sequence classifier, and reads the full
        starting weights (every rank maps the same files).

        The training state of a resumed run comes from the sharded checkpoints in ``output_dir/dcp``
        (``training.ShardedRecipeState``).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full model state under ``training.MODEL_KEY`` (a causal LM's head as
            ``output.weight``, replaced by the classifier's), and the adapter (with the score head, if saved by a
            reward run) under ``training.ADAPTER_KEY`` when ``adapter_checkpoint`` is set.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        with config.errors_at("checkpointer._component_", cfg_checkpointer._component_):
            self._checkpointer.as_sequence_classifier(pad_token_id=self._tokenizer.pad_id)
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (the ``*ForSequenceClassification`` model, for LoRA the merged model and
        the PEFT adapter with the score head, gathered to rank 0) and, unless this is the last step of the run, the
        sharded trainable weights and optimizer state to resume from in ``output_dir/dcp/step_N/``.

        A collective: every rank calls it.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, tokenizer, model, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        with training.errors_on_all_ranks():  # the logger writes on rank 0 only: its failure stops every rank
            self._metric_logger = config.instantiate(cfg.metric_logger)
            self._metric_logger.log_config(cfg)
        self._tokenizer = config.instantiate(cfg.tokenizer)  # its pad id finds each sequence's last token
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._trainable_params())
        self._loss_fn = config.instantiate(cfg.loss)
        log_info("Loss: %s.", config.component_name(cfg.loss))
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        self._val_dataloader = None
        if cfg.dataset_val is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, cfg.collate_fn, drop_last=False
            )
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), self._gradient_accumulation_steps, self._max_steps_per_epoch, self._dims.dp_size
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, self._total_steps)
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        self._recipe_state = config.sharded_recipe_state(  # what a save writes and a resume restores
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
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(cfg.seed, log)
        with training.errors_on_all_ranks():  # written by rank 0
            config.save_config(cfg, self._output_dir)

    def _setup_model(
        self, cfg: DictConfig, base_state_dict: dict[str, Any], adapter_state_dict: dict[str, Any] | None
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        head = getattr(getattr(model, "output", None), "weight", None)
        if head is None or head.shape[0] != 1:
            raise config.ConfigError(
                [
                    config.ConfigProblem(
                        "model._component_",
                        "builds a model without a one-output head; a reward model scores each sequence with one "
                        "number. Wrap the family's builder: {_component_: tune.models.classifier_model, num_classes: "
                        "1, base: {_component_: ...}}",
                        cfg.model._component_,
                    )
                ]
            )
        self._adapter_config = None
        if get_adapter_params(model):  # a LoRA base: its adapters and the score head train
            with config.errors_at("model._component_", cfg.model._component_):
                _, self._adapter_config = training.prepare_lora_model(model, model_converters=False)
            model.output.weight.requires_grad_(True)
            # the same seed on every rank (set in __init__, nothing random drawn since): equal adapters everywhere
            training.init_adapters(model, self._shard_device())
        # a causal LM's vocabulary head gives way to the classifier's fresh one, drawn alike on every rank (a
        # classifier checkpoint's own head is kept)
        models.init_classifier_head(model, self._shard_device())
        training.update_state_dict_for_classifier(base_state_dict, model.named_parameters())
        training.disable_dropout(model)  # as TRL's RewardTrainer (disable_dropout: true): rewards are deterministic
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
        with config.errors_at("checkpointer"):  # the weights must fit `model`
            if self._adapter_config is not None:  # the base, then a saved adapter (with its head) if set
                training.load_lora_state_dicts(
                    model, base_state_dict, adapter_state_dict, device=self._device, cpu_offload=self._fsdp_cpu_offload
                )
            else:
                training.load_from_full_model_state_dict(
                    model, base_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
                )
        training.validate_no_params_on_meta_device(model)
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log_info(
            "Reward model (%s): %s parameters, %s of them trainable, in %s, sharded over %d ranks.",
            "LoRA adapters and score head" if self._adapter_config else "full",
            f"{num_params:,}",
            f"{num_trainable:,}",
            self._dtype,
            self._dims.world_size,
        )
        return model

    def _shard_device(self) -> torch.device:
        return torch.device("cpu") if self._fsdp_cpu_offload else self._device

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
        # one shard of the pairs per data-parallel rank
        sampler = StatefulDistributedSampler(
            dataset, num_replicas=self._dims.dp_size, rank=self._dims.dp_rank, shuffle=shuffle, seed=self._seed
        )
        # training drops the ragged last batch: every step sees full batches, and a resumed run counts the same
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate,
            drop_last=drop_last,
            pin_memory=self._device.type == "cuda",
        )
        log_info(
            "Dataset %s: %d pairs, %d batches per rank.", config.component_name(cfg_dataset), len(dataset), len(loader)
        )
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
            torch.Tensor: the SUM of the per-pair losses (the loop divides by the pairs of the whole step on all
            ranks).
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
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)  # rank 0 only
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [data.preference_batch(next(batches)) for _ in range(self._gradient_accumulation_steps)]
                # every pair of the step on every rank weighs the same: the pairs are counted on the CPU batches
                # and summed over the ranks (a collective, no host-device sync)
                num_pairs = sum(batch.num_pairs for batch in micro_batches)
                loss_scale = self._loss_tokens.step_loss_scale(torch.tensor(num_pairs, device=device))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch.tokens, self._tokenizer.pad_id))
                    batch = batch.to(device, non_blocking=True)
                    loss = self.loss_step(batch, self._metrics) * loss_scale  # this rank's share of the step's mean
                    step_loss += loss.detach()
                    if batch_index == self._gradient_accumulation_steps - 1:  # the step's loss, read once
                        self._loss_check.record(step_loss)  # backward is queued, before the optimizer step
                    loss.backward()  # FSDP reduce-scatters (averages) the gradients over the ranks
                self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    loss = training.mean_over_ranks(self._loss_since_log).item() / steps_since_log  # a collective
                    # the reward metrics of every rank's pairs, collectives at logging steps only
                    rewards = self._metrics.compute(training.all_reduce_sum, training.all_reduce_max)
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=loss,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(rewards, optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,  # rank 0's
                        parallel=self._dims,  # tokens/s summed over the ranks (a collective)
                    )
                    with training.errors_on_all_ranks():  # rank 0 writes; a failed write stops every rank
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

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)  # over all shards
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _validate(self) -> None:
        """The mean loss and the reward metrics over the held-out pairs of all ranks, logged with a ``val_`` prefix
        (``val_accuracy``: the share of held-out pairs whose chosen response gets the higher reward)."""
        self._model.eval()
        metrics = RewardMetrics(self._device)
        totals = torch.zeros(2, dtype=torch.float32, device=self._device)  # summed loss, pairs
        for index, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            batch = data.preference_batch(batch)
            totals[0] += self.loss_step(batch.to(self._device), metrics).float()
            totals[1] += batch.num_pairs
        self._model.train()
        loss_sum, num_pairs = training.all_reduce_sum(totals).tolist()
        values = {"val_loss": loss_sum / max(num_pairs, 1.0)}
        rewards = metrics.compute(training.all_reduce_sum, training.all_reduce_max)
        values.update({f"val_{name}": value for name, value in rewards.items()})
        with training.errors_on_all_ranks():
            self._metric_logger.log_dict(values, step=self.global_step)
        log_info(
            "Step %d: validation loss %.4f, pair accuracy %.3f over %d pairs.",
            self.global_step,
            values["val_loss"],
            values.get("val_accuracy", float("nan")),
            int(num_pairs),
        )

    def cleanup(self) -> None:
        """Closes the metric logger and the process group."""
        self._metric_logger.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run --nproc_per_node N reward_model_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="RewardModelRecipeDistributed", cfg=cfg)
    recipe = RewardModelRecipeDistributed(cfg)
    recipe.setup(cfg)
    try:
        recipe.train()
    except training.NonFiniteLossError as err:  # a diverged run is a result, not a crash: no traceback
        utils.log_rank_zero(log, str(err), logging.ERROR)
        raise SystemExit(1) from None
    finally:
        recipe.cleanup()


if __name__ == "__main__":
    sys.exit(recipe_main())
