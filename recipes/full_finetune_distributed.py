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

import contextlib
import inspect
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
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

from tune import config, registry, training, utils
from tune.data import CROSS_ENTROPY_IGNORE_IDX, padded_collate_packed, padded_collate_sft
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import CEWithChunkedOutputLoss, LinearCrossEntropyLoss, shift_labels
from tune.training.checkpointing import (
    DistributedCheckpointer,
    StatefulDistributedSampler,
    get_rng_state,
    set_rng_state,
)

RECIPE_INFO = {"supports_distributed": True, "configs": ["*/*_full"]}

log = utils.get_logger("tune.recipes.full_finetune_distributed")
SCHEDULE_KEY = "finetuning_schedule"
PROGRESS_KEY = "progress"


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class FullFinetuneRecipeDistributed:
    """Full fine-tuning with FSDP2 (+ tensor parallelism); implements :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports what ``full_finetune_single_device`` supports except ``optimizer_in_bwd``: gradient accumulation,
    clipping, any optimizer and LR scheduler by ``_component_``, activation checkpointing and offloading,
    ``compile``, chunked cross-entropy, fp32/bf16 (and FSDP mixed precision), validation, step and epoch
    checkpoints with exact mid-epoch resume, metric loggers and the progress bar on rank 0, the profiler,
    ``model_converters`` and a ``finetuning_schedule``. Adds ``tensor_parallel_dim``, ``fsdp_cpu_offload``,
    ``fsdp_reshard_after_forward`` and ``dist_backend``.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu":
            training.configure_cpu_allocator()  # freed activations stay in the heap for the next step
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
        self._tensor_parallel_dim = cfg.get("tensor_parallel_dim", 1)
        self._fsdp_cpu_offload = cfg.get("fsdp_cpu_offload", False)
        self._fsdp_reshard_after_forward = cfg.get("fsdp_reshard_after_forward", True)
        # keys of ours that torchtune's configs lack: off unless set
        self._save_every_n_steps = cfg.get("save_every_n_steps", None)
        self._run_val_every_n_steps = cfg.get("run_val_every_n_steps", None)
        self._max_validation_steps = cfg.get("max_validation_steps", None)

        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._check_config(cfg)
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses

    def _check_config(self, cfg: DictConfig) -> None:
        problems = []  # every problem at once, each with its key, reported without a traceback
        accumulate = self._gradient_accumulation_steps
        if not isinstance(accumulate, int) or accumulate < 1:
            problems.append(config.ConfigProblem("gradient_accumulation_steps", "must be an integer >= 1", accumulate))
        if self._optimizer_in_bwd:
            problems.append(config.ConfigProblem(
                "optimizer_in_bwd",
                "is not supported by the distributed recipes (FSDP2 already shards the optimizer state across "
                "ranks); set optimizer_in_bwd: False",
                True,
            ))
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
        problems += self._init_distributed(cfg)
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
            try:
                self._finetuning_schedule = training.FinetuningSchedule(
                    cfg.finetuning_schedule, cfg.get("finetuning_schedule_auto_transition", None)
                )
            except ValueError as err:
                problems.append(config.ConfigProblem("finetuning_schedule", str(err)))
        return problems

    def _init_distributed(self, cfg: DictConfig) -> list[config.ConfigProblem]:
        # the process group (from torchrun's environment) and the (dp_shard, tp) mesh over it
        backend = cfg.get("dist_backend", None)
        if backend is None and self._device.type == "cuda":
            backend = "cuda:nccl,cpu:gloo"  # NCCL for the model's tensors, gloo for CPU-side state (DCP)
        try:
            training.init_distributed(backend)
        except ValueError as err:
            return [config.ConfigProblem("dist_backend", str(err), backend)]
        self._world_size, self._rank = dist.get_world_size(), dist.get_rank()
        self._is_rank_zero = self._rank == 0
        try:
            self._mesh = training.init_device_mesh(self._world_size, self._tensor_parallel_dim, self._device.type)
        except ValueError as err:
            return [config.ConfigProblem("tensor_parallel_dim", str(err), self._tensor_parallel_dim)]
        self._dp_rank, self._dp_size = training.data_parallel_rank_and_size(self._mesh)
        self._tp_size = training.tensor_parallel_size(self._mesh)
        log_info(
            "%d processes: %d data-parallel shard(s) x %d tensor-parallel rank(s), backend %s.",
            self._world_size, self._dp_size, self._tp_size, dist.get_backend(),
        )
        return []

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointers and reads the full model weights (every rank maps the same files).

        The checkpointer of the config reads the base model and writes the gathered outputs; the training state
        of a resumed run comes from the sharded checkpoints in ``output_dir/dcp`` (:meth:`_restore_recipe_state`).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the full model state under ``training.MODEL_KEY``.
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
        """Writes ``output_dir/step_N/`` (the model in its input format, gathered to rank 0) and, unless this is
        the last step of the run, the sharded training state to resume from in ``output_dir/dcp/step_N/``.

        A collective: every rank calls it.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._mean_loss_since_log()  # never save diverged weights (raises on every rank alike)
        if self.global_step < self._total_steps:
            self._dcp_checkpointer.save_checkpoint(
                self._sharded_state(epoch), epoch=self.epochs_run, step=self.global_step, config=self._cfg
            )
        full_state = training.gather_cpu_state_dict(self._model)  # a collective; only rank 0 receives it
        if self._is_rank_zero:
            self._checkpointer.save_checkpoint(
                {training.MODEL_KEY: full_state}, epoch=self.epochs_run, step=self.global_step, config=self._cfg
            )
        dist.barrier()

    def _sharded_state(self, epoch: int) -> dict[str, Any]:
        return {
            training.MODEL_KEY: get_model_state_dict(self._model),
            training.OPT_KEY: get_optimizer_state_dict(self._model, self._optimizer),
            PROGRESS_KEY: self._progress_state(epoch),
        }

    def _progress_state(self, epoch: int) -> dict[str, Any]:
        steps_in_epoch = self.global_step - epoch * self._steps_per_epoch
        samples_per_step = self._gradient_accumulation_steps * self._batch_size
        state = {
            training.LR_SCHEDULER_KEY: self._lr_scheduler.state_dict() if self._lr_scheduler is not None else None,
            training.SEED_KEY: self._seed,
            training.EPOCHS_KEY: self.epochs_run,
            training.TOTAL_EPOCHS_KEY: self._epochs,
            training.MAX_STEPS_KEY: self._max_steps_per_epoch,
            training.STEPS_KEY: self.global_step,
            training.DATALOADER_KEY: self._sampler.state_dict(num_consumed=steps_in_epoch * samples_per_step),
            training.RNG_KEY: get_rng_state(),  # every rank draws the same random numbers: rank 0's is saved
        }
        if self._finetuning_schedule is not None:
            state[SCHEDULE_KEY] = self._finetuning_schedule.state_dict()
        return state

    def _restore_recipe_state(self) -> None:
        progress = self._dcp_checkpointer.load_checkpoint({PROGRESS_KEY: self._progress_state(0)})[PROGRESS_KEY]
        if progress[training.SEED_KEY] != self._seed or progress[training.MAX_STEPS_KEY] != self._max_steps_per_epoch:
            log.warning(
                "Resuming with seed=%s, max_steps_per_epoch=%s but the checkpoint was written with %s, %s: the "
                "resumed run will not see the data an uninterrupted run would.",
                self._seed, self._max_steps_per_epoch, progress[training.SEED_KEY], progress[training.MAX_STEPS_KEY],
            )
        if self._finetuning_schedule is not None and progress.get(SCHEDULE_KEY) is not None:
            # before the optimizer's state: the phase's param groups must exist for it to load into
            for line in self._finetuning_schedule.load_state_dict(progress[SCHEDULE_KEY]):
                log_info(line)
        state = {
            training.MODEL_KEY: get_model_state_dict(self._model),
            training.OPT_KEY: self._saved_optimizer_state(),
        }
        self._dcp_checkpointer.load_checkpoint(state)  # each rank reads its own shards
        set_model_state_dict(self._model, state[training.MODEL_KEY])
        # strict=False: the parameters left out by _saved_optimizer_state keep no state, as in the first run
        set_optimizer_state_dict(
            self._model, self._optimizer, state[training.OPT_KEY], options=StateDictOptions(strict=False)
        )
        if self._lr_scheduler is not None and progress[training.LR_SCHEDULER_KEY] is not None:
            self._lr_scheduler.load_state_dict(progress[training.LR_SCHEDULER_KEY])
        try:  # the data position is per data-parallel rank: it resumes only with as many of them as before
            self._sampler.load_state_dict(progress[training.DATALOADER_KEY])
        except ValueError as err:
            raise config.ConfigError(config.ConfigProblem("resume_from_checkpoint", str(err), True)) from err
        self.epochs_run, self.global_step = progress[training.EPOCHS_KEY], progress[training.STEPS_KEY]
        set_rng_state(progress[training.RNG_KEY])  # last: setup drew random numbers that the first run did not
        log_info(
            "Resumed from %s after %d optimizer steps (%d epochs complete).",
            self._dcp_checkpointer.resume_dir, self.global_step, self.epochs_run,
        )

    def _saved_optimizer_state(self) -> dict[str, Any]:
        # the optimizer state to load into: the fresh optimizer's (its states created by a zero step), less the
        # parameters that had no state when the checkpoint was written (not stepped yet, e.g. the parameters a
        # finetuning_schedule had just unfrozen): the resumed run must create theirs when they first step too
        state = get_optimizer_state_dict(self._model, self._optimizer)
        saved = FileSystemReader(str(self._dcp_checkpointer.resume_dir)).read_metadata().state_dict_metadata
        prefix = f"{training.OPT_KEY}.state."
        stepped = {key[len(prefix):].rsplit(".", 1)[0] for key in saved if key.startswith(prefix)}
        state["state"] = {name: value for name, value in state["state"].items() if name in stepped}
        return state

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.get("keep_last_n_checkpoints", None)
        self._metric_logger = config.instantiate(cfg.metric_logger)  # writes on rank 0 only
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model_converters = config.instantiate(cfg.get("model_converters", None)) or []
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY])
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
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
                f"each of the {self._dp_size} data-parallel ranks gets {len(self._dataloader)} full batches, fewer "
                f"than gradient_accumulation_steps={self._gradient_accumulation_steps}: not one optimizer step per "
                "epoch. Lower batch_size or gradient_accumulation_steps, use fewer processes, or use more data",
                cfg.batch_size,
            ))
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = self._setup_lr_scheduler(cfg.get("lr_scheduler", None))
        self._setup_finetuning_schedule()
        self._profiler = self._setup_profiler(cfg.get("profiler", None))
        if self._resume:
            self._restore_recipe_state()
        config.save_config(cfg, self._output_dir)

    def _setup_model(self, cfg: DictConfig, full_state_dict: dict[str, Any]) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        model = self._apply_model_converters(model)
        if self._tp_size > 1:
            training.apply_tensor_parallel(model, self._tp_plan(cfg, model), self._mesh["tp"])
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        fsdp_dtypes = cfg.get("fsdp_mixed_precision", None) or {}
        training.shard_model(
            model,
            self._shard_conditions(cfg, model),
            cpu_offload=self._fsdp_cpu_offload,
            reshard_after_forward=self._fsdp_reshard_after_forward,
            param_dtype=utils.get_dtype(fsdp_dtypes["param_dtype"]) if fsdp_dtypes.get("param_dtype") else None,
            reduce_dtype=utils.get_dtype(fsdp_dtypes.get("reduce_dtype", "fp32")),
            mesh=self._mesh["dp_shard"],
        )
        training.load_from_full_model_state_dict(
            model, full_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
        )
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = self._activation_offloading_ctx()
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        log_info("Model: %s parameters in %s, sharded over %d ranks.", f"{num_params:,}", self._dtype, self._world_size)
        return model

    def _apply_model_converters(self, model: nn.Module) -> nn.Module:
        # on the model as built (meta device), before it is split and sharded and before the optimizer exists
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

    def _tp_plan(self, cfg: DictConfig, model: nn.Module) -> dict[str, Any]:
        # an explicit plan in the config (torchtune's `tensor_parallel_plan`), else the family's from the registry
        if cfg.get("tensor_parallel_plan", None) is not None:
            plan_fn = config.get_component_from_path(cfg.tensor_parallel_plan._component_)
            extra = {"model": model} if "model" in inspect.signature(plan_fn).parameters else {}
            return config.instantiate(cfg.tensor_parallel_plan, **extra)
        model_type = cfg.checkpointer.get("model_type", None)
        family = registry.get_model_family(model_type) if model_type is not None else None
        if family is None or family.tp_plan is None:
            raise config.ConfigError(config.ConfigProblem(
                "tensor_parallel_dim",
                f"is {self._tp_size} but the model family {model_type!r} (checkpointer.model_type) registers no "
                "tensor-parallel plan. Set tensor_parallel_dim: 1, or name a plan under tensor_parallel_plan",
                self._tp_size,
            ))
        return family.tp_plan(model)

    def _shard_conditions(self, cfg: DictConfig, model: nn.Module) -> list[Any]:
        # the family's FSDP units when it registers them, else one unit per transformer layer
        model_type = cfg.checkpointer.get("model_type", None)
        family = registry.get_model_family(model_type) if model_type is not None else None
        if family is not None and family.fsdp_shard_modules is not None:
            units = {id(module) for module in family.fsdp_shard_modules(model)}
            return [lambda name, module: id(module) in units]
        return [TransformerSelfAttentionLayer]

    def _activation_offloading_ctx(self) -> contextlib.AbstractContextManager:
        if not self._enable_activation_offloading:
            return contextlib.nullcontext()
        supported, reason = training.activation_offloading_supported(self._device)
        if not supported:
            log.warning("enable_activation_offloading=True is ignored: %s", reason)
            return contextlib.nullcontext()
        return training.OffloadActivations()

    def _setup_finetuning_schedule(self) -> None:
        if self._finetuning_schedule is None:
            return
        try:  # freezes every parameter outside phase 0 and takes it out of the optimizer
            lines = self._finetuning_schedule.setup(self._model, self._optimizer, self._lr_scheduler)
        except ValueError as err:
            raise config.ConfigError(config.ConfigProblem("finetuning_schedule", str(err))) from err
        for line in lines:
            log_info(line)

    def _setup_loss(self, cfg_loss: DictConfig) -> nn.Module:
        loss_fn = config.instantiate(cfg_loss)
        if isinstance(loss_fn, CEWithChunkedOutputLoss) and hasattr(self._model, "skip_output_layer"):
            # the same sum of token losses, but the output projection runs inside the loss one chunk at a time,
            # so full [tokens, vocab] logits never exist (torchtune configs name CEWithChunkedOutputLoss)
            loss_fn = LinearCrossEntropyLoss(loss_fn.num_output_chunks, loss_fn.ignore_index, loss_fn.reduction)
            log_info("loss: CEWithChunkedOutputLoss runs as LinearCrossEntropyLoss (same values, no full logits).")
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
            collate = partial(padded_collate_sft, padding_idx=pad_id, ignore_idx=CROSS_ENTROPY_IGNORE_IDX)
            if cfg_dataset.get("packed", False):
                collate = padded_collate_packed
        elif isinstance(cfg_collate, str):  # a function named by its dotted path, as in torchtune configs
            collate = config.get_component_from_path(cfg_collate)
            params = inspect.signature(collate).parameters
            known = {"padding_idx": self._tokenizer.pad_id, "ignore_idx": CROSS_ENTROPY_IGNORE_IDX}
            collate = partial(collate, **{k: v for k, v in known.items() if k in params})
        else:
            collate = config.instantiate(cfg_collate)  # a collator class configured by keyword arguments
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
        log_info("Dataset %s: %d samples, %d batches per rank.", cfg_dataset._component_, len(dataset), len(loader))
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
            by the loss tokens of the whole step on all ranks), and auxiliary metrics to log (tensors are fine:
            they are read only at logging steps).
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
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)  # rank 0 only
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # counted on the CPU batches, summed over all ranks (a collective, no host-device sync)
                num_tokens = sum(training.num_loss_tokens(shift_labels(b["labels"])) for b in micro_batches)
                loss_scale = training.step_loss_scale(num_tokens.to(device))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch in micro_batches:
                    throughput.update(training.count_tokens(batch["tokens"], self._tokenizer.pad_id))
                    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                    with self._activations_ctx:
                        loss_sum, aux_metrics = self.loss_step(batch)
                    loss = loss_sum * loss_scale  # this rank's share of the step's mean over all loss tokens
                    loss.backward()  # FSDP reduce-scatters (averages) the gradients over the data-parallel ranks
                    step_loss += loss.detach()
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    mean_loss = self._mean_loss_since_log() / steps_since_log
                    metrics = {"loss": mean_loss}
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
                        log_info(line)
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _mean_loss_since_log(self) -> float:
        # each rank holds its share of every step's mean loss: their sum over ranks is world_size x the mean
        # (tensor-parallel ranks of one group hold equal shares). A collective, and the check raises on all ranks.
        total = training.all_reduce_sum(self._loss_since_log) / self._world_size
        return training.check_loss_is_finite(total, self.global_step)

    def _optimizer_step(self) -> tuple[torch.Tensor, dict[str, Any]]:
        grad_norm = training.clip_grad_norm(self._model.parameters(), self._clip_grad_norm)  # over all shards
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _step_metrics(self, grad_norm: torch.Tensor, throughput: dict[str, float], *extra: dict) -> dict:
        # called at logging steps only: reading tensors here is the loop's one host-device sync
        rank_tps = torch.tensor(throughput["tokens_per_second"], dtype=torch.float64, device=self._device)
        total_tps = training.all_reduce_sum(rank_tps).item() / self._tp_size  # a tp group shares one batch
        metrics = {
            "lr": training.get_lr(self._optimizer),
            "tokens_per_second": total_tps,
            "tokens_per_second_per_gpu": total_tps / self._world_size,
            "grad_norm": grad_norm.item(),
        }
        for more in extra:
            metrics.update({k: v.item() if torch.is_tensor(v) else v for k, v in more.items()})
        if self._log_peak_memory_stats:
            metrics.update(training.get_memory_stats(self._device))  # rank 0's
        return metrics

    @torch.no_grad()
    def _validate(self) -> float:
        # each data-parallel rank evaluates its shard of the validation set; sums are then taken over ranks
        self._model.eval()
        total_loss = torch.zeros((), dtype=torch.float32, device=self._device)
        total_tokens = torch.zeros((), dtype=torch.float32, device=self._device)
        for i, batch in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and i >= self._max_validation_steps:
                break
            total_tokens += training.num_loss_tokens(shift_labels(batch["labels"])).to(self._device)
            loss_sum, _ = self.loss_step({k: v.to(self._device) for k, v in batch.items()})
            total_loss += loss_sum
        self._model.train()
        # tensor-parallel ranks count their group's batch alike: the ratio is unchanged
        loss_and_tokens = training.all_reduce_sum(torch.stack([total_loss, total_tokens]))
        val_loss = (loss_and_tokens[0] / loss_and_tokens[1].clamp(min=1.0)).item()
        self._metric_logger.log_dict({"val_loss": val_loss}, step=self.global_step)
        log_info("Step %d: validation loss %.4f over %d tokens.", self.global_step, val_loss, int(loss_and_tokens[1]))
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
