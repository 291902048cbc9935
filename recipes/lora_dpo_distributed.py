"""LoRA Direct Preference Optimization (DPO) of a language model on several devices with FSDP2.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 lora_dpo_distributed --config llama3_1/8B_lora_dpo
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        lora_dpo_distributed --config llama3_3/70B_lora_dpo

Trains LoRA adapters on preference pairs with a loss of ``tune.rlhf.loss`` (DPO and its hinge/IPO/robust variants, RSO,
the reference-free SimPO and ORPO, whose NLL of the chosen sequences is averaged over every chosen token of the step on
all ranks), as ``lora_dpo_single_device`` does: the reference model is the policy with its adapters disabled (no second
copy of the weights), sequence log-probabilities are sums over the completion tokens (means for IPO, SimPO and ORPO;
only the completion positions are projected onto the vocabulary), batches hold the chosen sequences then the rejected
ones (on CPU in one padding-free row unless ``context_parallel_dim > 1``: ``tune.data.padding_free_collate_dpo``), and
pairs are not packed. With ``precompute_ref_log_probs: true`` the reference's log-probs of every
training pair are computed once before training, each rank scoring its share of the pairs and the shares all-gathered,
so that every rank looks up any pair by its dataset index at each step (validation pairs still run the reference, as on
one device). The model is sharded as in ``lora_finetune_distributed`` (built on the meta device, adapters drawn from one
seed on every rank, ``fully_shard`` per transformer layer and on the root, each rank loading only its shards).
``batch_size`` is pairs per rank; the loss of a step is the mean over the pairs of all ranks and micro-batches, so N
ranks with batch b train exactly like one device with batch N*b, and the metrics (TRL's names: ``rewards/chosen``,
``rewards/accuracies``, ``logps/chosen``, ...) are averaged over the same pairs. Checkpoints: the adapter in the Hugging
Face PEFT format and the merged model, gathered to rank 0 (``output_dir/step_N/``), and the sharded adapter and
optimizer state for resuming (``output_dir/dcp/step_N/``). The file keeps the structure of
``lora_finetune_distributed.py`` (the wiring) and the ``loss_step`` of ``lora_dpo_single_device.py`` (the math).
"""

import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, data, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.peft import (
    disable_adapter,
)
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_lora_dpo", "*/*_qlora_dpo", "*/*_lora_orpo", "*/*_qlora_orpo"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "distributed", "dpo"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "a chosen and a rejected sequence form one sample; preference pairs are not packed",
    "model_converters": "build the model with a lora_* builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "tensor_parallel_dim": config.KeepDefault(
        "tensor parallelism splits plain linear layers, not LoRA layers; FSDP2 shards the model over every rank"
    ),
}

log = utils.get_logger(name="tune.recipes.lora_dpo_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class LoRADPORecipeDistributed:
    """LoRA/QLoRA/DoRA preference optimization with FSDP2; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``lora_dpo_single_device`` supports except ``optimizer_in_bwd``: gradient accumulation (the loss
    is the mean over all pairs of the step on all ranks), clipping, any optimizer and LR scheduler by
    ``_component_``, activation checkpointing and offloading, ``compile``, fp32/bf16 (and FSDP mixed precision),
    validation (loss and reward metrics over the held-out pairs of all ranks), step and epoch checkpoints with exact
    mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler. Adds ``fsdp_cpu_offload``,
    ``fsdp_reshard_after_forward`` and ``dist_backend``; ``tensor_parallel_dim`` must be 1.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_lora_dpo.yaml``).

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
        self._precompute_reference = cfg.precompute_ref_log_probs
        self._dims = config.init_parallel(cfg, self._device)  # process group and device meshes
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)
        self._metrics = rlhf.PreferenceMetrics(self._device)  # this rank's sums since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointers and reads the full base weights (every rank maps the same files).

        The checkpointer of the config reads the base model (and ``adapter_checkpoint``, if set) and writes the
        gathered outputs; the adapters and optimizer of a resumed run come from the sharded checkpoints in
        ``output_dir/dcp`` (``training.ShardedRecipeState``).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full base model state under ``training.MODEL_KEY``, and the adapter under
            ``training.ADAPTER_KEY`` when ``adapter_checkpoint`` is set.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (the adapter in the PEFT format and, unless ``save_adapter_weights_only``,
        the merged model in its input format, gathered to rank 0 and written once) and, unless this is the last
        step of the run, the sharded adapter and optimizer state to resume from in ``output_dir/dcp/step_N/``.

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
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._trainable_params())
        self._loss_fn = config.instantiate(cfg.loss)
        # what the loss needs (tune.rlhf.loss): mean instead of summed log-probs, and whether a reference is used
        self._average_log_probs = getattr(self._loss_fn, "average_log_probs", False)
        self._reference_free = getattr(self._loss_fn, "reference_free", False)
        # ORPO: the loss asks for the chosen sequences' NLL (added here) and reports its log odds ratio
        self._chosen_nll = getattr(self._loss_fn, "chosen_nll", False)
        self._log_odds = getattr(self._loss_fn, "log_odds", None)
        reference = "no reference model" if self._reference_free else "reference: the model with adapters disabled"
        log_info("Loss: %s (%s).", config.component_name(cfg.loss), reference)
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        # the reference's log-probs of every training pair, by dataset index (None: computed at every step)
        self._reference_table = None
        if self._precompute_reference and self._reference_free:
            message = (
                f"precompute_ref_log_probs has no effect: {config.component_name(cfg.loss)} needs no reference model."
            )
            utils.log_rank_zero(log, message, logging.WARNING)
        elif self._precompute_reference:
            pairs = self._dataloader.dataset.dataset  # IndexedPairs around the pairs
            # a collective: every rank scores its share of the pairs (sharded forward passes), then all hold all;
            # the reference is the policy with its adapters disabled
            with disable_adapter(self._model):
                self._reference_table = rlhf.precompute_reference_log_probs(
                    self._model,
                    pairs,
                    self._collate,
                    batch_size=cfg.batch_size,
                    device=self._device,
                    average_log_probs=self._average_log_probs,
                    process_group=self._dims.mesh["dp_shard"].get_group(),
                )
            log_info(
                "Reference log-probabilities of %d training pairs computed once, over %d ranks.",
                len(pairs),
                self._dims.dp_size,
            )
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
        with config.errors_at("model._component_", cfg.model._component_):  # only the adapters learn
            _, self._adapter_config = training.prepare_lora_model(
                model, full_recipe="full_dpo_distributed", model_converters=False
            )
        # the same seed on every rank (set in __init__, nothing random drawn since): equal adapters everywhere
        training.init_adapters(model, self._shard_device())
        # the policy and the reference (the same model, adapters off) must score a sequence the same way
        with config.errors_at("context_parallel_dim", self._dims.cp_size):  # a model it cannot slice is refused
            training.check_context_parallel(model, self._dims.cp_size)
        self._context_parallel = training.ContextParallel(self._dims.mesh["cp"], CROSS_ENTROPY_IGNORE_IDX)
        training.disable_dropout(model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
        # the base weights, then a saved adapter if set (a resumed run loads its adapters from DCP later)
        training.load_lora_state_dicts(
            model, base_state_dict, adapter_state_dict, device=self._device, cpu_offload=self._fsdp_cpu_offload
        )
        training.validate_no_params_on_meta_device(model)  # adapters not loaded must have been initialised
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log_info(
            "Model: %s parameters, %s of them trainable adapter weights, in %s, sharded over %d ranks.",
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
        # chosen sequences first, then rejected ones: padded rows, or one padding-free row (not under context
        # parallelism, which cuts padded rows)
        self._collate = config.instantiate_collate(
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            max_seq_len=getattr(self._model, "max_seq_len", None),
            device_type=self._device.type,
            pairs=True,
            padding_free=self._dims.cp_size == 1,
        )
        # one shard of the pairs per data-parallel rank
        sampler = StatefulDistributedSampler(
            dataset, num_replicas=self._dims.dp_size, rank=self._dims.dp_rank, shuffle=shuffle, seed=self._seed
        )
        # training drops the ragged last batch: every step sees full batches, and a resumed run counts the same;
        # each batch carries its pairs' dataset indices (where precomputed reference log-probs are looked up)
        loader = DataLoader(
            rlhf.IndexedPairs(dataset),
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=rlhf.collate_with_indices(self._collate),
            drop_last=drop_last,
            pin_memory=self._device.type == "cuda",
        )
        log_info(
            "Dataset %s: %d pairs, %d batches per rank.", config.component_name(cfg_dataset), len(dataset), len(loader)
        )
        return sampler, loader

    # ---------------------------------------------------------------------------------------------------- train

    def loss_step(
        self,
        batch: data.PreferenceBatch,
        metrics: rlhf.PreferenceMetrics,
        indices: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward passes and loss of one micro-batch of pairs. Override this in a copied recipe to change the
        objective.

        Args:
            batch (data.PreferenceBatch): the chosen sequences, then the rejected ones (labels ``-100`` outside the
                completions, not shifted): padded rows [2b, s], or one padding-free row [1, T] with its sequence
                lengths, positions and mask (``batch.packed``); already on the device.
            metrics (rlhf.PreferenceMetrics): where the rewards, log-probabilities and logits of the pairs go.
            indices (torch.Tensor | None): the pairs' dataset indices [b], where precomputed reference
                log-probabilities are looked up; None runs the reference.

        Returns:
            tuple[torch.Tensor, torch.Tensor | None]: the SUM of the per-pair losses (the loop divides by the pairs
            of the whole step on all ranks) and, for a loss with ``chosen_nll`` (ORPO), the SUM of the negative
            log-likelihood of the chosen sequences' tokens (the loop divides by those tokens of the whole step on
            all ranks); None otherwise.
        """
        tokens, labels, packed = batch.tokens, batch.labels, batch.packed  # packed: {} for padded rows
        average = self._average_log_probs  # means instead of sums (IPO, SimPO, ORPO)
        # ORPO: every token of the chosen sequences (prompt included) is scored in the same pass, for the NLL
        nll_labels = rlhf.chosen_nll_labels(tokens, labels, seq_lens=batch.seq_lens) if self._chosen_nll else None
        reference = None
        if self._reference_table is not None and indices is not None:
            looked_up = self._reference_table[indices.to(self._device)]  # [b, 2]: every rank holds every pair
            reference = (looked_up[:, 0], looked_up[:, 1])
        elif not self._reference_free:  # the policy with its adapters disabled (its output layer's too)
            with torch.no_grad(), disable_adapter(self._model):
                reference = rlhf.model_sequence_log_probs(
                    self._model,
                    tokens,
                    labels,
                    average_log_probs=average,
                    context_parallel=self._context_parallel,
                    **packed,
                )
                reference = reference.log_probs.chunk(2)
        with self._activations_ctx:  # only the completion positions are projected onto the vocabulary
            scores = rlhf.model_sequence_log_probs(
                self._model,
                tokens,
                labels,
                average_log_probs=average,
                context_parallel=self._context_parallel,
                nll_labels=nll_labels,
                **packed,
            )
        policy = scores.log_probs.chunk(2)
        if reference is None:
            losses, chosen_rewards, rejected_rewards = self._loss_fn(*policy)
        else:
            losses, chosen_rewards, rejected_rewards = self._loss_fn(*policy, *reference)
        nll = None if nll_labels is None else scores.nll_sums.sum()
        metrics.update(
            chosen_rewards,
            rejected_rewards,
            policy[0].detach(),
            policy[1].detach(),
            logit_sums=scores.logit_sums,
            num_tokens=scores.num_tokens,
            nll_sum=nll,
            nll_tokens=scores.nll_tokens,
            log_odds=None if self._log_odds is None else self._log_odds(policy[0].detach(), policy[1].detach()),
        )
        return losses.sum(), nll

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
                # every pair of the step on every rank weighs the same: the pairs are counted on the CPU batches
                # and summed over the ranks (a collective, no host-device sync)
                num_pairs = sum(batch.num_pairs for batch, _ in micro_batches)
                num_tokens = sum(training.num_loss_tokens(batch.labels) for batch, _ in micro_batches)
                loss_scale = self._loss_tokens.step_loss_scale(
                    torch.tensor(num_pairs, device=device), num_loss_tokens=num_tokens.to(device)
                )
                if self._chosen_nll:  # ORPO's NLL is a mean over every chosen token of the step on all ranks
                    nll_labels = [
                        rlhf.chosen_nll_labels(b.tokens, b.labels, seq_lens=b.seq_lens) for b, _ in micro_batches
                    ]
                    num_nll_tokens = sum(training.num_loss_tokens(n[:, 1:]) for n in nll_labels)
                    nll_scale = training.step_loss_scale(num_nll_tokens.to(device))  # a collective
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, (batch, indices) in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch.tokens, self._tokenizer.pad_id))
                    batch = batch.to(device, non_blocking=True)
                    # this rank's share of the step's mean
                    pair_loss, nll = self.loss_step(batch, self._metrics, indices)
                    loss = pair_loss * loss_scale
                    if nll is not None:  # ORPO: plus its share of the step's NLL per chosen token
                        loss = loss + nll * nll_scale
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
                    # the preference metrics' sums of every rank, one collective at logging steps only
                    preference = self._metrics.compute(all_reduce=training.all_reduce_sum)
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=loss,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(preference, optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,  # rank 0's
                        parallel=self._dims,  # tokens/s summed over the ranks (a collective)
                    )
                    with training.errors_on_all_ranks():  # rank 0 writes; a failed write stops every rank
                        self._metric_logger.log_dict(metrics, step=self.global_step)
                    pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {metrics['loss']:.4f}")
                    pbar.set_postfix(accuracy=f"{metrics['rewards/accuracies']:.2f}")
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

    def _validate(self) -> None:
        """The mean loss and the reward metrics over the held-out pairs of all ranks, logged with a ``val_``
        prefix."""
        self._model.eval()
        metrics = rlhf.PreferenceMetrics(self._device)
        totals = torch.zeros(2, dtype=torch.float32, device=self._device)  # summed loss, pairs
        for index, (batch, _) in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            totals[0] += self.loss_step(batch.to(self._device), metrics)[0].float()
            totals[1] += batch.num_pairs
        self._model.train()
        loss_sum, num_pairs = training.all_reduce_sum(totals).tolist()
        values = {"val_loss": loss_sum / max(num_pairs, 1.0)}
        values.update({f"val_{name}": value for name, value in metrics.compute(training.all_reduce_sum).items()})
        values["val_loss"] += values.get("val_nll_loss", 0.0)  # ORPO: plus the chosen sequences' NLL per token
        with training.errors_on_all_ranks():
            self._metric_logger.log_dict(values, step=self.global_step)
        log_info(
            "Step %d: validation loss %.4f, reward accuracy %.3f over %d pairs.",
            self.global_step,
            values["val_loss"],
            values.get("val_rewards/accuracies", float("nan")),
            int(num_pairs),
        )

    def cleanup(self) -> None:
        """Closes the metric logger and the process group."""
        self._metric_logger.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run --nproc_per_node N lora_dpo_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="LoRADPORecipeDistributed", cfg=cfg)
    recipe = LoRADPORecipeDistributed(cfg)
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
