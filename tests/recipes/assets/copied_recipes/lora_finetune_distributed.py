"""LoRA, QLoRA and DoRA fine-tuning of a language model on several devices with FSDP2.

Launched by torchrun, one process per device, on one node or many::

    tune run --nproc_per_node 8 lora_finetune_distributed --config llama3_1/70B_lora
    tune run --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\
        lora_finetune_distributed --config llama3_1/70B_lora

Which of the three runs is the model builder's choice in the config (``lora_llama3_1_70b``, ``qlora_...``,
``use_dora: True``). The model is built on the meta device; the adapters are created on every rank from the
same seed, so they start equal everywhere; FSDP2 shards the model (``fully_shard`` per transformer layer and on
the root) and each rank loads only its shards of the frozen base weights (QLoRA quantises each to NF4 first).
Only the adapters train. ``batch_size`` is per rank; the loss of a step is normalised by the loss tokens of all
ranks, so N ranks with batch b train exactly like one rank with batch N*b. Checkpoints: the adapter in the
Hugging Face PEFT format and the merged model in its input format, gathered to rank 0 (``output_dir/step_N/``),
and the sharded adapter and optimizer state for resuming, written by every rank with
torch.distributed.checkpoint (``output_dir/dcp/step_N/``). The file reads top to bottom like
``lora_finetune_single_device.py``, of which it keeps the structure, the config keys and ``loss_step``.
"""

import logging
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.utils.data import DataLoader

from tune import config, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import shift_labels
from tune.modules.peft import (
    get_adapter_config,
    get_adapter_params,
    get_adapter_state_dict,
    get_merged_lora_ckpt,
    initialize_dora_magnitudes,
    is_adapter_key,
    set_trainable_params,
    validate_lora_state_dict_load,
)
from tune.training.checkpointing import DistributedCheckpointer, StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_lora", "*/*_qlora"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "distributed", "moe"],
}

log = utils.get_logger(name="tune.recipes.lora_finetune_distributed")
PROGRESS_KEY = "progress"


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class LoRAFinetuneRecipeDistributed:
    """LoRA/QLoRA/DoRA fine-tuning with FSDP2; implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``lora_finetune_single_device`` supports except ``optimizer_in_bwd``: gradient accumulation,
    clipping, any optimizer and LR scheduler by ``_component_``, activation checkpointing and offloading,
    ``compile``, chunked cross-entropy, fp32/bf16 (and FSDP mixed precision), validation, step and epoch
    checkpoints with exact mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler,
    ``model_converters`` and a ``finetuning_schedule``. Adds ``fsdp_cpu_offload``, ``fsdp_reshard_after_forward``,
    ``dist_backend`` and ``expert_parallel_dim`` (mixture-of-experts models: whole experts per rank, their adapters
    with them, tokens exchanged by all-to-all). Tensor parallelism splits plain linear layers only:
    ``tensor_parallel_dim`` must be 1 (use ``full_finetune_distributed`` for it).

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_lora.yaml``).

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
        self._save_adapter_weights_only = cfg.save_adapter_weights_only
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._compile = cfg.compile
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._tensor_parallel_dim = cfg.tensor_parallel_dim
        self._expert_parallel_dim = cfg.expert_parallel_dim
        self._fsdp_cpu_offload = cfg.fsdp_cpu_offload
        self._fsdp_reshard_after_forward = cfg.fsdp_reshard_after_forward
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
        self._init_distributed(cfg)
        self._configured_seed = cfg.seed
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)

    def _init_distributed(self, cfg: DictConfig) -> None:
        # the process group (from torchrun's environment) and the (dp_shard, tp) mesh over it
        backend = cfg.dist_backend
        if backend is None and self._device.type == "cuda":
            backend = "cuda:nccl,cpu:gloo"  # NCCL for the model's tensors, gloo for CPU-side state (DCP)
        with config.errors_at("dist_backend", backend):
            training.init_distributed(backend)
        self._world_size, self._rank = dist.get_world_size(), dist.get_rank()
        self._is_rank_zero = self._rank == 0
        with config.errors_at("tensor_parallel_dim", self._tensor_parallel_dim):
            self._mesh = training.init_device_mesh(self._world_size, self._tensor_parallel_dim, self._device.type)
        self._dp_rank, self._dp_size = training.data_parallel_rank_and_size(self._mesh)
        self._tp_size = training.tensor_parallel_size(self._mesh)
        self._ep_mesh = None  # expert parallelism: groups of expert_parallel_dim ranks, each holding whole experts
        if self._expert_parallel_dim > 1:
            with config.errors_at("expert_parallel_dim", self._expert_parallel_dim):
                self._ep_mesh = training.init_expert_parallel_mesh(
                    self._world_size, self._expert_parallel_dim, self._device.type
                )
        log_info(
            "%d processes: %d data-parallel shard(s) x %d tensor-parallel rank(s), %d expert-parallel, backend %s.",
            self._world_size,
            self._dp_size,
            self._tp_size,
            self._expert_parallel_dim,
            dist.get_backend(),
        )

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointers and reads the full base weights (every rank maps the same files).

        The checkpointer of the config reads the base model (and ``adapter_checkpoint``, if set) and writes the
        gathered outputs; the adapters and optimizer of a resumed run come from the sharded checkpoints in
        ``output_dir/dcp`` (:meth:`_restore_recipe_state`).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full base model state under ``training.MODEL_KEY``, and the adapter under
            ``training.ADAPTER_KEY`` when ``adapter_checkpoint`` is set.
        """
        extra = {"resume_from_checkpoint": False}  # the base weights come from checkpoint_dir; the rest from DCP
        if self._keep_last_n_checkpoints is not None:
            extra["keep_last_n_checkpoints"] = self._keep_last_n_checkpoints
        self._checkpointer = config.instantiate(cfg_checkpointer, **extra)
        self._dcp_checkpointer = DistributedCheckpointer(
            output_dir=Path(self._output_dir) / "dcp",
            resume_from_checkpoint=self._resume,
            keep_last_n_checkpoints=self._keep_last_n_checkpoints,
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
        if self.global_step < self._total_steps:
            self._dcp_checkpointer.save_checkpoint(
                self._sharded_state(epoch), epoch=self.epochs_run, step=self.global_step, config=self._cfg
            )
        # a collective; only rank 0 receives the full tensors (NF4 base weights dequantised)
        key_filter = is_adapter_key if self._save_adapter_weights_only else None
        full_state = training.gather_cpu_state_dict(self._model, key_filter=key_filter)
        with training.errors_on_all_ranks():  # the others wait for rank 0's save, and stop with it if it fails
            if self._is_rank_zero:
                state = {
                    training.ADAPTER_KEY: get_adapter_state_dict(full_state),
                    training.ADAPTER_CONFIG: self._adapter_config,
                }
                if not self._save_adapter_weights_only:
                    # the merged model has the base architecture: it loads without any LoRA code
                    state[training.MODEL_KEY] = get_merged_lora_ckpt(
                        full_state, rank=self._adapter_config["r"], alpha=self._adapter_config["lora_alpha"]
                    )
                self._checkpointer.save_checkpoint(
                    state,
                    epoch=self.epochs_run,
                    step=self.global_step,
                    adapter_only=self._save_adapter_weights_only,
                    config=self._cfg,
                )

    def _sharded_state(self, epoch: int) -> dict[str, Any]:
        return {
            training.MODEL_KEY: self._adapter_state(),
            training.OPT_KEY: get_optimizer_state_dict(self._model, self._optimizer),
            PROGRESS_KEY: self._progress_state(epoch),
        }

    def _adapter_state(self) -> dict[str, Any]:
        # only the adapters change: the frozen base is the checkpoint_dir's, loaded again on resume
        return {k: v for k, v in get_model_state_dict(self._model).items() if is_adapter_key(k)}

    def _progress_state(self, epoch: int) -> dict[str, Any]:
        return training.progress_state(
            seed=self._seed,
            epochs_run=self.epochs_run,
            total_epochs=self._epochs,
            max_steps_per_epoch=self._max_steps_per_epoch,
            global_step=self.global_step,
            steps_in_epoch=self.global_step - epoch * self._steps_per_epoch,
            samples_per_step=self._gradient_accumulation_steps * self._batch_size,
            sampler=self._sampler,
            lr_scheduler=self._lr_scheduler,
            finetuning_schedule=self._finetuning_schedule,
        )

    def _restore_recipe_state(self) -> None:
        progress = self._dcp_checkpointer.load_checkpoint({PROGRESS_KEY: self._progress_state(0)})[PROGRESS_KEY]
        self.epochs_run, self.global_step, self._seed = training.restore_progress(
            progress,
            seed=self._configured_seed,  # null: the run's own, saved in the checkpoint
            max_steps_per_epoch=self._max_steps_per_epoch,
            sampler=self._sampler,  # its position is per data-parallel rank: resumes only with as many of them
            load_optimizer=self._load_sharded_state,
            lr_scheduler=self._lr_scheduler,
            finetuning_schedule=self._finetuning_schedule,
            logger=log,
        )
        log_info(
            "Resumed from %s after %d optimizer steps (%d epochs complete).",
            self._dcp_checkpointer.resume_dir,
            self.global_step,
            self.epochs_run,
        )

    def _load_sharded_state(self) -> None:
        state = {
            training.MODEL_KEY: self._adapter_state(),
            training.OPT_KEY: self._saved_optimizer_state(),
        }
        self._dcp_checkpointer.load_checkpoint(state)  # each rank reads its own shards
        set_model_state_dict(self._model, state[training.MODEL_KEY], options=StateDictOptions(strict=False))
        # strict=False: the parameters left out by _saved_optimizer_state keep no state, as in the first run
        set_optimizer_state_dict(
            self._model, self._optimizer, state[training.OPT_KEY], options=StateDictOptions(strict=False)
        )

    def _saved_optimizer_state(self) -> dict[str, Any]:
        # the optimizer state to load into: the fresh optimizer's (its states created by a zero step), less the
        # parameters that had no state when the checkpoint was written (not stepped yet, e.g. the parameters a
        # finetuning_schedule had just unfrozen): the resumed run must create theirs when they first step too
        state = get_optimizer_state_dict(self._model, self._optimizer)
        saved = FileSystemReader(str(self._dcp_checkpointer.resume_dir)).read_metadata().state_dict_metadata
        prefix = f"{training.OPT_KEY}.state."
        stepped = {key[len(prefix) :].rsplit(".", 1)[0] for key in saved if key.startswith(prefix)}
        state["state"] = {name: value for name, value in state["state"].items() if name in stepped}
        return state

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
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._optimizer = config.instantiate(cfg.optimizer, self._trainable_params())
        training.register_post_optimizer_hooks(self._optimizer, self._model, self._model_converters)
        self._loss_fn = training.prepare_loss(
            config.instantiate(cfg.loss), self._model, compile=self._compile, reduction="sum"
        )
        # mixture-of-experts models: the load-balancing loss (added when router_aux_loss_coef > 0) and routing
        # metrics; nothing for other models
        self._router_aux_loss = training.RouterAuxLoss(self._model, cfg.router_aux_loss_coef, self._tokenizer.pad_id)
        self._batch_size = cfg.batch_size
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        self._val_dataloader = None
        if cfg.dataset_val is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, cfg.collate_fn, drop_last=False
            )
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), self._gradient_accumulation_steps, self._max_steps_per_epoch, self._dp_size
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, self._total_steps)
        self._setup_finetuning_schedule()
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        if self._resume:
            self._restore_recipe_state()
        with training.errors_on_all_ranks():  # written by rank 0
            config.save_config(cfg, self._output_dir)

    def _setup_model(
        self, cfg: DictConfig, base_state_dict: dict[str, Any], adapter_state_dict: dict[str, Any] | None
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        model = self._apply_model_converters(model)  # a LoRAConverter puts adapters on a model built without them
        adapter_params = self._check_adapters(model, cfg.model)
        # the same seed on every rank (set in __init__, nothing random drawn since): equal adapters everywhere
        training.init_adapters(model, self._shard_device())
        set_trainable_params(model, adapter_params)  # only the adapters learn
        if self._tp_size > 1:  # refused for LoRA layers, with the reason
            with config.errors_at("tensor_parallel_dim", self._tp_size):
                plan = config.instantiate_tensor_parallel_plan(
                    cfg.tensor_parallel_plan, model, cfg.checkpointer.get("model_type")
                )
                training.apply_tensor_parallel(model, plan, self._mesh["tp"])
        if self._ep_mesh is not None:  # each rank keeps whole experts; the MoE layers exchange tokens by all-to-all
            with config.errors_at("expert_parallel_dim", self._expert_parallel_dim):
                training.apply_expert_parallel(model, self._ep_mesh)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        self._shard_and_load(cfg, model, base_state_dict, adapter_state_dict)
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
            self._world_size,
        )
        return model

    def _check_adapters(self, model: nn.Module, cfg_model: DictConfig) -> dict[str, nn.Parameter]:
        adapter_params = get_adapter_params(model)
        if not adapter_params:
            raise config.ConfigError(
                config.ConfigProblem(
                    "model._component_",
                    "builds a model without LoRA/DoRA layers: nothing for this recipe to train. Use a lora_*/qlora_* "
                    "builder, add tune.training.LoRAConverter to model_converters, or use full_finetune_distributed",
                    cfg_model._component_,
                )
            )
        self._adapter_config = get_adapter_config(model)  # r, lora_alpha, lora_dropout as built
        return adapter_params

    def _shard_and_load(
        self,
        cfg: DictConfig,
        model: nn.Module,
        base_state_dict: dict[str, Any],
        adapter_state_dict: dict[str, Any] | None,
    ) -> None:
        fsdp_dtypes = cfg.fsdp_mixed_precision or {}
        training.shard_model(
            model,
            training.family_shard_conditions(model, cfg.checkpointer.get("model_type")),
            cpu_offload=self._fsdp_cpu_offload,
            reshard_after_forward=self._fsdp_reshard_after_forward,
            param_dtype=utils.get_dtype(fsdp_dtypes["param_dtype"]) if fsdp_dtypes.get("param_dtype") else None,
            reduce_dtype=utils.get_dtype(fsdp_dtypes.get("reduce_dtype", "fp32")),
            dp_mesh=self._mesh["dp_shard"],
            expert_mesh=self._ep_mesh,  # expert-parallel experts: their own units over the ranks holding them
        )
        model_keys = set(model.state_dict())
        validate_lora_state_dict_load(
            model, model_keys - set(base_state_dict), set(base_state_dict) - model_keys, loaded="base"
        )
        device, offload = self._device, self._fsdp_cpu_offload
        training.load_from_full_model_state_dict(model, base_state_dict, device, strict=False, cpu_offload=offload)
        initialize_dora_magnitudes(model)  # DoRA's magnitude starts as the norm of the LOADED base weight
        if adapter_state_dict is not None:  # continuing from a saved adapter (a resumed run loads DCP later)
            validate_lora_state_dict_load(
                model, model_keys - set(adapter_state_dict), set(adapter_state_dict) - model_keys, loaded="adapter"
            )
            training.load_from_full_model_state_dict(
                model, adapter_state_dict, device, strict=False, cpu_offload=offload
            )
        training.validate_no_params_on_meta_device(model)  # adapters not loaded must have been initialised

    def _shard_device(self) -> torch.device:
        return torch.device("cpu") if self._fsdp_cpu_offload else self._device

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
            dataset, num_replicas=self._dp_size, rank=self._dp_rank, shuffle=shuffle, seed=self._seed
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
        outputs = self._model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
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
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)  # rank 0 only
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # counted on the CPU batches, summed over all ranks (a collective, no host-device sync)
                num_tokens = sum(training.num_loss_tokens(shift_labels(b["labels"])) for b in micro_batches)
                loss_scale = training.step_loss_scale(num_tokens.to(device))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, batch in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
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
                    loss = self._mean_loss_since_log() / steps_since_log
                    metrics = self._step_metrics(loss, grad_norm, throughput.compute(), aux_metrics, optimizer_metrics)
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
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _mean_loss_since_log(self) -> float:
        # each rank holds its share of every step's mean loss: their sum over ranks is world_size x the mean
        # (tensor-parallel ranks of one group hold equal shares). A collective.
        return (training.all_reduce_sum(self._loss_since_log) / self._world_size).item()

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)  # over all shards
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    def _step_metrics(self, loss: float, grad_norm: torch.Tensor, throughput: dict[str, float], *extra: dict) -> dict:
        # at logging steps only: reads tensors (the loop's one host-device sync) and sums tokens/s over all ranks
        rank_tps = torch.tensor(throughput["tokens_per_second"], dtype=torch.float64, device=self._device)
        total_tps = training.all_reduce_sum(rank_tps).item() / self._tp_size  # a tp group shares one batch
        metrics = training.step_metrics(
            loss=loss,
            optimizer=self._optimizer,
            tokens_per_second=total_tps,
            grad_norm=grad_norm,
            extra=extra,
            memory_device=self._device if self._log_peak_memory_stats else None,  # rank 0's
        )
        metrics["tokens_per_second_per_gpu"] = total_tps / self._world_size
        return metrics

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
    """Entry point: ``tune run --nproc_per_node N lora_finetune_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="LoRAFinetuneRecipeDistributed", cfg=cfg)
    recipe = LoRAFinetuneRecipeDistributed(cfg)
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
