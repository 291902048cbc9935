"""Full fine-tuning of a language model on several devices: FSDP2, optionally with tensor parallelism.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 full_finetune_distributed --config llama3_1/8B_full
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        full_finetune_distributed --config llama3_1/70B_full

Every parameter is trained. The model is built on the meta device, split across the ranks of each
tensor-parallel group (``tensor_parallel_dim``, the family's plan from ``tune.registry``), sharded with FSDP2
(``fully_shard`` per transformer layer and on the root), and each rank loads only its shards from the full
checkpoint. ``batch_size`` is per data-parallel rank; the loss of a step is normalised by the loss tokens of all
ranks, so N ranks with batch b train exactly like one rank with batch N*b. Checkpoints: the model in its input
format, gathered to rank 0 (``output_dir/step_N/``), and the sharded training state for resuming, written by
every rank with torch.distributed.checkpoint (``output_dir/dcp/step_N/``). The file reads top to bottom like
``full_finetune_single_device.py``, of which it keeps the structure, the config keys and ``loss_step``.
"""

import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import shift_labels
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_full"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "distributed", "moe"],
}

log = utils.get_logger(name="tune.recipes.full_finetune_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class FullFinetuneRecipeDistributed:
    """Full fine-tuning with FSDP2 (+ tensor parallelism); implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``full_finetune_single_device`` supports except ``optimizer_in_bwd``: gradient accumulation,
    clipping, any optimizer and LR scheduler by ``_component_``, activation checkpointing and offloading,
    ``compile``, chunked cross-entropy, fp32/bf16 (and FSDP mixed precision), validation, step and epoch
    checkpoints with exact mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler,
    ``model_converters`` and a ``finetuning_schedule``. Adds ``tensor_parallel_dim``, ``expert_parallel_dim``
    (mixture-of-experts models: whole experts per rank, tokens exchanged by all-to-all), ``fsdp_cpu_offload``,
    ``fsdp_reshard_after_forward`` and ``dist_backend``.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg, distributed=True)  # every problem of the settings at once
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
        self._expert_parallel_dim = cfg.expert_parallel_dim
        self._fsdp_cpu_offload = cfg.fsdp_cpu_offload
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
        self._dims = config.init_parallel(cfg, self._device)  # process group and device meshes
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointers and reads the full model weights (every rank maps the same files).

        The checkpointer of the config reads the base model and writes the gathered outputs; the training state
        of a resumed run comes from the sharded checkpoints in ``output_dir/dcp`` (``ShardedRecipeState``).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full model state under ``training.MODEL_KEY``.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (the model in its input format, gathered to rank 0) and, unless this is
        the last step of the run, the sharded training state to resume from in ``output_dir/dcp/step_N/``.

        A collective: every rank calls it.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        with training.errors_on_all_ranks():  # the logger writes on rank 0 only: its failure stops every rank
            self._metric_logger = config.instantiate(cfg.metric_logger)
            self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model_converters = config.instantiate(cfg.model_converters) or []
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY])
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
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
                len(self._dataloader), self._gradient_accumulation_steps, self._max_steps_per_epoch, self._dims.dp_size
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, self._total_steps)
        self._setup_finetuning_schedule()
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
            finetuning_schedule=self._finetuning_schedule,
        )
        if self._resume:
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(cfg.seed, log)
        with training.errors_on_all_ranks():  # written by rank 0
            config.save_config(cfg, self._output_dir)

    def _setup_model(self, cfg: DictConfig, full_state_dict: dict[str, Any]) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        model = self._apply_model_converters(model)
        if self._dims.tp_size > 1:  # the config's tensor_parallel_plan, else the model family's
            with config.errors_at("tensor_parallel_dim", self._dims.tp_size):
                plan = config.instantiate_tensor_parallel_plan(
                    cfg.tensor_parallel_plan, model, self._checkpointer.model_family
                )
                training.apply_tensor_parallel(model, plan, self._dims.mesh["tp"])
        if self._dims.ep_mesh is not None:  # each rank keeps whole experts; the MoE layers exchange tokens
            with config.errors_at("expert_parallel_dim", self._expert_parallel_dim):
                training.apply_expert_parallel(model, self._dims.ep_mesh)
        with config.errors_at("context_parallel_dim", self._dims.cp_size):  # a model it cannot slice is refused
            training.check_context_parallel(model, self._dims.cp_size)
        self._context_parallel = training.ContextParallel(self._dims.mesh["cp"], CROSS_ENTROPY_IGNORE_IDX)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
        training.load_from_full_model_state_dict(
            model, full_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
        )
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        log_info(
            "Model: %s parameters in %s, sharded over %d ranks.", f"{num_params:,}", self._dtype, self._dims.world_size
        )
        return model

    def _apply_model_converters(self, model: nn.Module) -> nn.Module:
        # on the model as built (meta device), before it is split and sharded and before the optimizer exists
        with config.errors_at("model_converters"):
            model = training.apply_model_converters(model, self._model_converters)
        if self._finetuning_schedule is not None:
            with config.errors_at("finetuning_schedule"):
                self._finetuning_schedule.validate(model)
        return model

    def _setup_finetuning_schedule(self) -> None:
        if self._finetuning_schedule is None:
            return
        with config.errors_at("finetuning_schedule"):  # freezes every parameter outside phase 0
            lines = self._finetuning_schedule.setup(self._model, self._optimizer, self._lr_scheduler)
        for line in lines:
            log_info(line)

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
        # one shard of the data per data-parallel rank; the ranks of a tensor-parallel group share theirs
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
            "Dataset %s: %d samples, %d batches per rank.",
            config.component_name(cfg_dataset),
            len(dataset),
            len(loader),
        )
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
            by the loss tokens of the whole step on all ranks), and auxiliary metrics to log (tensors are fine:
            they are read only at logging steps).
        """
        labels = shift_labels(batch["labels"], CROSS_ENTROPY_IGNORE_IDX)
        # context parallelism: this rank's chunks of every sequence (the batch as it is without it)
        tokens, labels, inputs = self._context_parallel.shard(batch["tokens"], labels, training.model_inputs(batch))
        outputs = self._model(tokens, **inputs)
        loss, metrics = self._router_aux_loss(self._loss_fn(outputs, labels), tokens, labels)
        return self._context_parallel.sum(loss), metrics  # the whole sequences' loss, on every rank of the group

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
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # counted on the CPU batches, summed over all ranks (a collective, no host-device sync)
                num_tokens = sum(training.num_loss_tokens(shift_labels(b["labels"])) for b in micro_batches)
                loss_scale = self._loss_tokens.step_loss_scale(num_tokens.to(device))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = training.batch_to_device(batch, device)
                    with self._activations_ctx:
                        loss_sum, aux_metrics = self.loss_step(batch)
                    loss = loss_sum * loss_scale  # this rank's share of the step's mean over all loss tokens
                    step_loss += loss.detach()
                    if batch_index == self._gradient_accumulation_steps - 1:  # the step's loss, read once
                        self._loss_check.record(step_loss)  # backward is queued, before the optimizer step
                    loss.backward()  # FSDP reduce-scatters (averages) the gradients over the data-parallel ranks
                self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    loss = training.mean_over_ranks(self._loss_since_log).item() / steps_since_log  # a collective
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=loss,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(aux_metrics, optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,  # rank 0's
                        parallel=self._dims,  # tokens/s summed over the ranks (a collective)
                    )
                    with training.errors_on_all_ranks():  # rank 0 writes; a failed write stops every rank
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
                        log_info(line)
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self._loss_tokens.check(epoch, end_of_epoch)  # reads the token counts: a save syncs anyway
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._model.parameters(), self._clip_grad_norm)  # over all shards
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _validate(self) -> float:
        # each data-parallel rank evaluates its shard of the validation set; the sums are taken over all ranks
        # (tensor-parallel ranks count their group's batch alike: the ratio is unchanged)
        self._model.eval()
        val_loss, num_tokens = training.validation_loss(
            self.loss_step,
            self._val_dataloader,
            self._device,
            max_steps=self._max_validation_steps,
            all_reduce=training.all_reduce_sum,
        )
        self._model.train()
        with training.errors_on_all_ranks():
            self._metric_logger.log_dict({"val_loss": val_loss}, step=self.global_step)
        log_info("Step %d: validation loss %.4f over %d tokens.", self.global_step, val_loss, num_tokens)
        return val_loss

    def cleanup(self) -> None:
        """Closes the metric logger and the process group."""
        self._metric_logger.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run --nproc_per_node N full_finetune_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="FullFinetuneRecipeDistributed", cfg=cfg)
    recipe = FullFinetuneRecipeDistributed(cfg)
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
