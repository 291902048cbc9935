"""Full Direct Preference Optimization (DPO) of a language model on several devices with FSDP2.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 full_dpo_distributed --config llama3_1/8B_full_dpo
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        full_dpo_distributed --config llama3_1/8B_full_dpo

It is also the full fine-tuning recipe on ONE device: ``tune run --nproc_per_node 1 full_dpo_distributed --config ...``
(or ``tune run full_dpo_distributed ...``, one process without torchrun) trains exactly as N ranks do with N times the
batch; a reference-free loss (SimPO, ORPO) needs no second copy of the weights there.

Every parameter of the policy is trained on preference pairs with a loss of ``tune.rlhf.loss`` (DPO and its
hinge/IPO/robust variants, RSO, the reference-free SimPO and ORPO). The reference model is a frozen copy of the starting
weights, read by ``ref_checkpointer`` (torchtune's key; point it at the same checkpoint as ``checkpointer``) and sharded
exactly like the policy (``fully_shard`` per transformer layer and on the root), so that it costs each rank one shard of
the weights; a reference-free loss builds none. With ``precompute_ref_log_probs: true`` (TRL's name) the reference's
log-probs of every training pair, and of every validation pair, are computed once before training (each rank scores its
share of the pairs, the shares are all-gathered so that every rank holds every pair's, and looked up by dataset index at
each step), then the reference model is released: training holds no reference weights and runs one forward pass per
micro-batch instead of two. At step 1 the policy equals the reference: the DPO loss is ln 2 and every reward is 0.
Sequence log-probabilities are sums over the completion tokens (means for IPO and SimPO; only the completion positions
are projected onto the vocabulary); batches hold the chosen sequences then the rejected ones, on CPU in one row
without padding (``tune.data.padding_free_collate_dpo``, the default there unless ``context_parallel_dim > 1``),
elsewhere padded (``tune.data.padded_collate_dpo``); pairs are not packed.
``batch_size`` is pairs per rank; the loss of a step is the mean over the pairs of all ranks and micro-batches (N ranks
with batch b train exactly like one device with batch N*b), and the metrics under TRL's names are averaged over the same
pairs. Checkpoints: the policy in its input format, gathered to rank 0 (``output_dir/step_N/``), and the sharded policy,
optimizer and progress for resuming (``output_dir/dcp/step_N/``); the reference is always read again from
``ref_checkpointer``. The file keeps the structure of ``full_finetune_distributed.py`` (the wiring) and the
``loss_step`` of ``lora_dpo_single_device.py`` (the math), with the reference as a second model. ORPO adds the NLL of
the chosen sequences, averaged over every chosen token of the step on all ranks, as in ``lora_dpo_single_device``.
"""

import gc
import logging
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, data, rlhf, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_full_dpo", "*/*_full_orpo"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "distributed", "dpo", "reference"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "a chosen and a rejected sequence form one sample; preference pairs are not packed",
    "model_converters": "the reference must be the policy's starting point; fine-tune with a converter first",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "tensor_parallel_dim": config.KeepDefault(
        "this recipe shards the policy and the reference with FSDP2 only; fsdp_cpu_offload: True where they do not fit"
    ),
}

log = utils.get_logger(name="tune.recipes.full_dpo_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class FullDPORecipeDistributed:
    """Full preference optimization with FSDP2 and a sharded frozen reference (or, with
    ``precompute_ref_log_probs``, its log-probs computed once and the reference released); implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is the mean over all pairs of the step on all ranks), clipping, any
    optimizer and LR scheduler by ``_component_``, activation checkpointing and offloading (of the policy),
    ``compile``, fp32/bf16 (and FSDP mixed precision), validation (loss and reward metrics over the held-out pairs
    of all ranks), step and epoch checkpoints with exact mid-epoch resume, metric loggers and the progress bar on
    rank 0, the profiler, ``fsdp_cpu_offload``, ``fsdp_reshard_after_forward`` and ``dist_backend``.
    ``tensor_parallel_dim`` must be 1 and ``optimizer_in_bwd`` False.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_dpo.yaml``).

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
        """Builds the checkpointers and reads the full policy weights (every rank maps the same files).

        The checkpointer of the config reads the starting model and writes the gathered outputs; the training
        state of a resumed run comes from the sharded checkpoints in ``output_dir/dcp``
        (``training.ShardedRecipeState``).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full model state under ``training.MODEL_KEY``.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def load_ref_checkpoint(self, cfg_ref_checkpointer: DictConfig) -> dict[str, Any]:
        """Reads the reference model's weights (never a training state: the reference does not change).

        Args:
            cfg_ref_checkpointer (DictConfig): the ``ref_checkpointer`` section.

        Returns:
            dict[str, Any]: the reference's full state under ``training.MODEL_KEY``.
        """
        checkpointer = config.instantiate(cfg_ref_checkpointer, resume_from_checkpoint=False)
        return checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (the policy in its input format, gathered to rank 0) and, unless this is
        the last step of the run, the sharded training state to resume from in ``output_dir/dcp/step_N/``. The
        reference is never saved.

        A collective: every rank calls it.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, policy, reference, tokenizer, optimizer, loss, data, LR scheduler, profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        with training.errors_on_all_ranks():  # the logger writes on rank 0 only: its failure stops every rank
            self._metric_logger = config.instantiate(cfg.metric_logger)
            self._metric_logger.log_config(cfg)
        self._loss_fn = config.instantiate(cfg.loss)
        # what the loss needs (tune.rlhf.loss): mean instead of summed log-probs, and whether a reference is used
        self._average_log_probs = getattr(self._loss_fn, "average_log_probs", False)
        self._reference_free = getattr(self._loss_fn, "reference_free", False)
        # ORPO: the loss asks for the chosen sequences' NLL (added here) and reports its log odds ratio
        self._chosen_nll = getattr(self._loss_fn, "chosen_nll", False)
        self._log_odds = getattr(self._loss_fn, "log_odds", None)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY], trainable=True)
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._ref_model = None
        if self._reference_free and cfg.ref_checkpointer is not None:
            message = f"ref_checkpointer has no effect: {config.component_name(cfg.loss)} needs no reference model."
            utils.log_rank_zero(log, message, logging.WARNING)
        if not self._reference_free:
            if cfg.ref_checkpointer is None:
                raise config.ConfigError(
                    config.ConfigProblem(
                        "ref_checkpointer",
                        f"is null, but {config.component_name(cfg.loss)} compares the policy with a reference model: "
                        "point it at the starting checkpoint (the checkpointer section's files)",
                    )
                )
            ref_ckpt = self.load_ref_checkpoint(cfg.ref_checkpointer)
            self._ref_model = self._setup_model(cfg, ref_ckpt[training.MODEL_KEY], trainable=False)
            del ref_ckpt
        reference = "no reference model" if self._reference_free else "reference: the frozen ref_checkpointer model"
        log_info("Loss: %s (%s).", config.component_name(cfg.loss), reference)
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        # the reference's log-probs of the training and validation pairs, by dataset index (None: the reference
        # model runs at every step)
        self._reference_table = self._val_reference_table = None
        precompute = self._precompute_reference and not self._reference_free
        if self._precompute_reference and self._reference_free:
            message = (
                f"precompute_ref_log_probs has no effect: {config.component_name(cfg.loss)} needs no reference model."
            )
            utils.log_rank_zero(log, message, logging.WARNING)
        if precompute:
            self._reference_table = self._precompute_reference_table(self._dataloader, cfg.batch_size, "training")
        self._val_dataloader = None
        if cfg.dataset_val is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, cfg.collate_fn, drop_last=False
            )
            if precompute:  # validation needs the reference too, and it is about to go
                self._val_reference_table = self._precompute_reference_table(
                    self._val_dataloader, cfg.batch_size, "validation"
                )
        if precompute:
            self._release_reference()
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
        )
        if self._resume:
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(cfg.seed, log)
        with training.errors_on_all_ranks():  # written by rank 0
            config.save_config(cfg, self._output_dir)

    def _precompute_reference_table(self, loader: DataLoader, batch_size: int, split: str) -> torch.Tensor:
        # a collective: every rank scores its share of the pairs (sharded forward passes), then all hold all
        pairs = loader.dataset.dataset  # IndexedPairs around the pairs
        table = rlhf.precompute_reference_log_probs(
            self._ref_model,
            pairs,
            self._collate,  # the collate of the last _setup_data: this loader's
            batch_size=batch_size,
            device=self._device,
            average_log_probs=self._average_log_probs,
            process_group=self._dims.mesh["dp_shard"].get_group(),
        )
        log_info(
            "Reference log-probabilities of %d %s pairs computed once, over %d ranks.",
            len(pairs),
            split,
            self._dims.dp_size,
        )
        return table

    def _release_reference(self) -> None:
        # the tables replace the reference model: drop the recipe's handle and check that nothing else holds it
        # (FSDP's hooks tie the module and its state in reference cycles, hence the collection)
        reference = weakref.ref(self._ref_model)
        self._ref_model = None
        gc.collect()
        if reference() is None:
            log_info("Reference model released: training holds no reference weights.")
        else:
            utils.log_rank_zero(
                log, "The reference model is still referenced: its memory is not freed.", logging.WARNING
            )

    def _setup_model(self, cfg: DictConfig, full_state_dict: dict[str, Any], trainable: bool) -> nn.Module:
        """The policy (``trainable``) or the frozen reference: built from ``model`` on the meta device, sharded
        with the same FSDP2 units and settings, and loaded shard by shard from a full state dict."""
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        with config.errors_at("context_parallel_dim", self._dims.cp_size):  # a model it cannot slice is refused
            training.check_context_parallel(model, self._dims.cp_size)
        self._context_parallel = training.ContextParallel(self._dims.mesh["cp"], CROSS_ENTROPY_IGNORE_IDX)
        if trainable:  # the policy and the reference must score a sequence the same way: no dropout in either
            training.disable_dropout(model)
            if self._enable_activation_checkpointing:
                training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        else:  # frozen: evaluation mode (no dropout), no gradients
            model.eval()
            model.requires_grad_(False)
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
        with config.errors_at("checkpointer" if trainable else "ref_checkpointer"):  # the weights must fit `model`
            training.load_from_full_model_state_dict(
                model, full_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
            )
        if self._compile:
            training.compile_model(model)
        if trainable:
            self._activations_ctx = training.activation_offloading_context(
                self._enable_activation_offloading, self._device
            )
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        log_info(
            "%s: %s parameters in %s, sharded over %d ranks.",
            "Policy" if trainable else "Reference (frozen)",
            f"{num_params:,}",
            self._dtype,
            self._dims.world_size,
        )
        return model

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
        reference_log_probs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward passes and loss of one micro-batch of pairs. Override this in a copied recipe to change the
        objective.

        Args:
            batch (data.PreferenceBatch): the chosen sequences, then the rejected ones (labels ``-100`` outside the
                completions, not shifted): padded rows [2b, s], or one padding-free row [1, T] with its sequence
                lengths, positions and mask (``batch.packed``); already on the device.
            metrics (rlhf.PreferenceMetrics): where the rewards, log-probabilities and logits of the pairs go.
            reference_log_probs (torch.Tensor | None): the reference's precomputed log-probabilities of the pairs
                [b, 2] (chosen, rejected), looked up by the caller; None runs the reference model.

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
        if reference_log_probs is not None:
            reference = (reference_log_probs[:, 0], reference_log_probs[:, 1])
        elif self._ref_model is not None:
            with torch.no_grad():
                reference = rlhf.model_sequence_log_probs(
                    self._ref_model,
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
                    reference = self._look_up(self._reference_table, indices)
                    # this rank's share of the step's mean
                    pair_loss, nll = self.loss_step(batch, self._metrics, reference)
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

    def _look_up(self, table: torch.Tensor | None, indices: torch.Tensor) -> torch.Tensor | None:
        # precomputed reference log-probs [b, 2] of the pairs at these dataset indices (every rank holds all pairs)
        return None if table is None else table[indices.to(self._device)]

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._model.parameters(), self._clip_grad_norm)  # over all shards
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _validate(self) -> None:
        """The mean loss and the reward metrics over the held-out pairs of all ranks, logged with a ``val_``
        prefix."""
        self._model.eval()
        metrics = rlhf.PreferenceMetrics(self._device)
        totals = torch.zeros(2, dtype=torch.float32, device=self._device)  # summed loss, pairs
        for index, (batch, indices) in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            reference = self._look_up(self._val_reference_table, indices)
            totals[0] += self.loss_step(batch.to(self._device), metrics, reference)[0].float()
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
    """Entry point: ``tune run --nproc_per_node N full_dpo_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="FullDPORecipeDistributed", cfg=cfg)
    recipe = FullDPORecipeDistributed(cfg)
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
