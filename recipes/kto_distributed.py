"""Kahneman-Tversky Optimization (KTO) of a language model on several devices with FSDP2.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 kto_distributed --config qwen3/8B_lora_kto
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        kto_distributed --config qwen2_5/7B_full_kto

Trains on unpaired feedback, as ``kto_single_device`` does: each example is a prompt, one completion and whether that
completion is desirable (``tune.datasets.unpaired_preference_dataset``, or ``tune.datasets.unpaired_from_pairs`` for
preference pairs), with ``tune.rlhf.loss.KTOLoss`` (``loss_type`` kto or apo_zero_unpaired) on summed completion
log-probabilities. LoRA or full fine-tuning, as the model builder says. With LoRA adapters the model is sharded as in
``lora_finetune_distributed`` (built on the meta device, adapters drawn from one seed on every rank) and the reference
is the policy with its adapters disabled. A model without adapters is trained in full against a frozen reference built
like the policy and sharded exactly as it is (``fully_shard`` per transformer layer and on the root), so that it costs
each rank one shard of the weights: read by ``ref_checkpointer`` (torchtune's key) or, when that is null, from the
``checkpointer``'s starting weights.

``batch_size`` is examples per rank. The KL estimate ``z0`` of a step is the mean over the KL rows of all ranks and
micro-batches (the partners are fixed by the dataset's ``kl_group_size``, whatever rank reads a row), scored without
gradients before the step's loss; the loss of a step is the mean over the examples of all ranks and micro-batches. N
ranks with batch b therefore train exactly like one device with batch N*b, and the metrics (TRL's names: ``kl``,
``rewards/chosen``, ``logps/rejected``, ...) and the validation's ``val_desirable_rate`` are over the same examples.
Checkpoints: the adapter in the Hugging Face PEFT format and the merged model, or the full model, gathered to rank 0
(``output_dir/step_N/``), and the sharded trainable state and optimizer for resuming (``output_dir/dcp/step_N/``); the
reference is never saved. The file keeps the structure of ``full_dpo_distributed.py`` (the wiring) and the
``kl_estimate`` and ``loss_step`` of ``kto_single_device.py`` (the math).
"""

import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.peft import disable_adapter, get_adapter_params
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_kto"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "distributed", "kto", "reference"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "an example comes with its KL row; unpaired examples are not packed",
    "model_converters": "build the model with a lora_* builder (LoRA) or the full builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "tensor_parallel_dim": config.KeepDefault(
        "this recipe shards the policy (and a full fine-tune's reference) with FSDP2 only; fsdp_cpu_offload: True "
        "where they do not fit"
    ),
    "context_parallel_dim": config.KeepDefault(
        "an example and its KL row are scored whole on one rank; lower tokenizer.max_seq_len or turn on "
        "enable_activation_checkpointing where they do not fit"
    ),
}

log = utils.get_logger(name="tune.recipes.kto_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class KTORecipeDistributed:
    """KTO (LoRA/QLoRA/DoRA or full) with FSDP2; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``kto_single_device`` supports: gradient accumulation (the loss is the mean over all examples of
    the step on all ranks, the KL estimate over all of its KL rows on all ranks), clipping, any optimizer and LR
    scheduler by ``_component_``, activation checkpointing and offloading, ``compile``, fp32/bf16 (and FSDP mixed
    precision), validation (loss, metrics and desirable rate over the held-out examples of all ranks), step and epoch
    checkpoints with exact mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler. Adds
    ``fsdp_cpu_offload``, ``fsdp_reshard_after_forward``, ``dist_backend`` and ``ref_checkpointer``;
    ``tensor_parallel_dim`` and ``context_parallel_dim`` must be 1 and ``optimizer_in_bwd`` False.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_kto.yaml``).

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
        self._metrics = rlhf.KTOMetrics(self._device)  # this rank's sums since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the full starting weights (every rank maps the same files).

        The checkpointer of the config reads the starting model (and ``adapter_checkpoint``, if set) and writes the
        gathered outputs; the training state of a resumed run comes from the sharded checkpoints in
        ``output_dir/dcp`` (``training.ShardedRecipeState``).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full model state under ``training.MODEL_KEY``, and the adapter under
            ``training.ADAPTER_KEY`` when ``adapter_checkpoint`` is set.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (for LoRA the adapter in the PEFT format and, unless
        ``save_adapter_weights_only``, the merged model; else the model; in its input format, gathered to rank 0)
        and, unless this is the last step of the run, the sharded training state to resume from in
        ``output_dir/dcp/step_N/``. The reference is never saved.

        A collective: every rank calls it.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, reference, tokenizer, optimizer, loss, data, LR scheduler, profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        with training.errors_on_all_ranks():  # the logger writes on rank 0 only: its failure stops every rank
            self._metric_logger = config.instantiate(cfg.metric_logger)
            self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        # LoRA: the policy with its adapters disabled; full: a frozen sharded copy of the starting weights
        self._reference = None
        if self._adapter_config is not None and cfg.ref_checkpointer is not None:
            message = "ref_checkpointer has no effect: with LoRA adapters the reference is the model without them."
            utils.log_rank_zero(log, message, logging.WARNING)
        elif self._adapter_config is None:
            self._reference = self._setup_reference(cfg, ckpt[training.MODEL_KEY])
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._trainable_params())
        self._loss_fn = config.instantiate(cfg.loss)
        self._needs_kl = getattr(self._loss_fn, "needs_kl", True)
        log_info(
            "Loss: %s (%s; %s).",
            config.component_name(cfg.loss),
            "KL estimate from the dataset's KL rows on all ranks" if self._needs_kl else "no KL estimate",
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
        """The policy: built from ``model`` on the meta device, sharded, and loaded shard by shard from the full
        starting weights (then a saved adapter, if set; a resumed run loads its training state from DCP later)."""
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        self._adapter_config = None
        if get_adapter_params(model):  # LoRA: only the adapters learn
            with config.errors_at("model._component_", cfg.model._component_):
                _, self._adapter_config = training.prepare_lora_model(model, model_converters=False)
            # the same seed on every rank (set in __init__, nothing random drawn since): equal adapters everywhere
            training.init_adapters(model, self._shard_device())
        # the policy and the reference must score a sequence the same way, with and without gradients
        training.disable_dropout(model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
        with config.errors_at("checkpointer"):  # the weights must fit `model`
            if self._adapter_config is not None:
                training.load_lora_state_dicts(
                    model, base_state_dict, adapter_state_dict, device=self._device, cpu_offload=self._fsdp_cpu_offload
                )
            else:  # full fine-tuning
                training.load_from_full_model_state_dict(
                    model, base_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
                )
        training.validate_no_params_on_meta_device(model)  # adapters not loaded must have been initialised
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log_info(
            "Model: %s parameters, %s of them trainable (%s), in %s, sharded over %d ranks.",
            f"{num_params:,}",
            f"{num_trainable:,}",
            "LoRA" if self._adapter_config is not None else "full fine-tuning",
            self._dtype,
            self._dims.world_size,
        )
        return model

    def _setup_reference(self, cfg: DictConfig, starting_state_dict: dict[str, Any]) -> nn.Module:
        """The frozen reference of a full fine-tune, sharded like the policy: ``ref_checkpointer``'s weights, or the
        ``checkpointer``'s starting ones (never a resumed state: the distributed checkpointer always reads them)."""
        state_dict, source = starting_state_dict, "the checkpointer's starting weights"
        if cfg.ref_checkpointer is not None:
            with config.errors_at("ref_checkpointer"):
                checkpointer = config.instantiate(cfg.ref_checkpointer, resume_from_checkpoint=False)
                state_dict = checkpointer.load_checkpoint()[training.MODEL_KEY]
            source = "ref_checkpointer"
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            reference = config.instantiate(cfg.model)
        reference.eval()  # no dropout
        reference.requires_grad_(False)
        config.shard_model(cfg, reference, self._dims, self._checkpointer.model_family)  # the policy's FSDP2 units
        with config.errors_at("ref_checkpointer" if source == "ref_checkpointer" else "checkpointer"):
            training.load_from_full_model_state_dict(
                reference, state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
            )
        if self._compile:
            training.compile_model(reference)
        log_info("Reference: a frozen copy of %s, sharded over %d ranks.", source, self._dims.world_size)
        return reference

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
            rlhf.check_unpaired_dataset(dataset, needs_kl=self._needs_kl)
        collate = config.instantiate_collate(
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            device_type=self._device.type,
        )
        # one shard of the examples per data-parallel rank; each example carries its own KL row
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
            "Dataset %s: %d examples, %d batches per rank.",
            config.component_name(cfg_dataset),
            len(dataset),
            len(loader),
        )
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
        """KTO's reference point ``z0`` for one optimizer step: the mean over the KL rows of all its micro-batches on
        all ranks of ``log pi(y'|x) - log pi_ref(y'|x)``, clamped at 0. Scored before the step's loss, with the
        weights the loss sees. A collective: the sum and the count are all-reduced before dividing.

        Args:
            micro_batches (list[dict[str, torch.Tensor]]): this rank's batches of the step (``kl_tokens``,
                ``kl_labels``).

        Returns:
            torch.Tensor: 0-d, detached, ``>= 0``, the same on every rank.
        """
        totals = torch.zeros(2, dtype=torch.float32, device=self._device)  # summed log-ratio, KL rows
        for batch in micro_batches:
            tokens, labels = batch["kl_tokens"].to(self._device), batch["kl_labels"].to(self._device)
            policy = rlhf.model_sequence_log_probs(self._model, tokens, labels).log_probs
            totals[0] += (policy - self._reference_log_probs(tokens, labels)).float().sum()
            totals[1] += tokens.shape[0]
        log_ratio_sum, num_rows = training.all_reduce_sum(totals)  # every KL row of the step on every rank
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
            torch.Tensor: the SUM of the weighted per-example losses (the loop divides by the examples of the whole
            step on all ranks).
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
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)  # rank 0 only
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # every example of the step on every rank weighs the same: the examples are counted on the CPU
                # batches and summed over the ranks (a collective, no host-device sync)
                num_examples = sum(batch["tokens"].shape[0] for batch in micro_batches)
                num_tokens = sum(training.num_loss_tokens(batch["labels"]) for batch in micro_batches)
                loss_scale = self._loss_tokens.step_loss_scale(
                    torch.tensor(num_examples, device=device), num_loss_tokens=num_tokens.to(device)
                )
                kl = None
                if self._needs_kl:  # over every KL row of the step, before the weights it measures change
                    kl = self.kl_estimate(micro_batches)  # a collective
                    self._metrics.update_kl(kl)
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
                    loss = self.loss_step(batch, kl, self._metrics) * loss_scale  # this rank's share of the mean
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
                    # the KTO metrics' sums of every rank, one collective at logging steps only
                    kto = self._metrics.compute(all_reduce=training.all_reduce_sum)
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=loss,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(kto, optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,  # rank 0's
                        parallel=self._dims,  # tokens/s summed over the ranks (a collective)
                    )
                    with training.errors_on_all_ranks():  # rank 0 writes; a failed write stops every rank
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
        """The mean loss, the metrics and the desirable rate over the held-out examples of all ranks, logged with a
        ``val_`` prefix. Each validation batch (on all ranks together) is its own KL group."""
        self._model.eval()
        metrics, desirable_rate = rlhf.KTOMetrics(self._device), rlhf.DesirableRate()
        totals = torch.zeros(2, dtype=torch.float32, device=self._device)  # summed loss, examples
        for index, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            kl = None
            if self._needs_kl:
                kl = self.kl_estimate([batch])  # a collective
                metrics.update_kl(kl)
            batch = {key: value.to(self._device) for key, value in batch.items()}
            totals[0] += self.loss_step(batch, kl, metrics, desirable_rate).float()
            totals[1] += batch["tokens"].shape[0]
        self._model.train()
        loss_sum, num_examples = training.all_reduce_sum(totals).tolist()
        rate, num_comparisons = desirable_rate.compute(all_ranks=True)  # a collective
        values = {"val_loss": loss_sum / max(num_examples, 1.0), "val_desirable_rate": rate}
        values.update({f"val_{name}": value for name, value in metrics.compute(training.all_reduce_sum).items()})
        with training.errors_on_all_ranks():
            self._metric_logger.log_dict(values, step=self.global_step)
        log_info(
            "Step %d: validation loss %.4f over %d examples, desirable rate %.3f over %d same-prompt comparisons.",
            self.global_step,
            values["val_loss"],
            int(num_examples),
            rate,
            num_comparisons,
        )

    def cleanup(self) -> None:
        """Closes the metric logger and the process group."""
        self._metric_logger.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run --nproc_per_node N kto_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="KTORecipeDistributed", cfg=cfg)
    recipe = KTORecipeDistributed(cfg)
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
