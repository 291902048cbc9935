"""Group Relative Policy Optimization (GRPO) of a whole language model on several GPUs (FSDP2, torchrun).

What ``grpo_full_finetune_single_device`` does, with the model (and the reference, when ``loss.beta > 0``) sharded
over the data-parallel ranks: each rank takes ``batch_size`` prompts of the step, samples and scores their
``grpo_samples`` completions (a prompt's group stays on one rank, so its advantages need no other rank), and the
loss of the step is normalised over the completions (and tokens) of every rank, so that the gradient is the one
of the whole batch. Each completion is sampled from its own generator, seeded by the run's seed, the step, the
prompt's index in the dataset and the completion's number: a resumed run samples what the uninterrupted one would,
and a prompt's completions do not depend on the rank or micro-batch that generates them, so N ranks train as one
device with N times the batch. Outputs: ``output_dir/step_N/`` (gathered to rank 0, the input's format)
and the sharded training state in ``output_dir/dcp/step_N/``.

    tune run --nproc_per_node 8 grpo_full_finetune_distributed --config qwen3/4B_full_grpo
    tune cp grpo_full_finetune_distributed my_recipe.py   # then: tune run ... my_recipe.py --config my.yaml
"""

import contextlib
import logging
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

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
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader, Dataset

from tune import config, generation, rlhf, training, utils
from tune.modules import TransformerSelfAttentionLayer
from tune.training.checkpointing import DistributedCheckpointer, StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_full_grpo"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "distributed"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "optimizer_in_bwd": "every PPO pass over a batch takes one optimizer step after its micro-batches",
    "fsdp_mixed_precision": "the GRPO recipes run the model in dtype",
    "compile": "generation changes the sequence shapes at every step",
    "dataset_val": "there is no held-out loss in RL; evaluate the saved checkpoint with the generate or eval recipes",
    "run_val_every_n_steps": "there is no held-out loss in RL",
    "collate_fn": "prompts are left-padded by the recipe",
    "model_converters": "not supported by the GRPO recipes",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
}
PROGRESS_KEY = "progress"

log = utils.get_logger(name="tune.recipes.grpo_full_finetune_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class Trajectory(NamedTuple):
    """A batch of sampled completions, scored: everything the optimisation passes need."""

    sequences: torch.Tensor  # [n, p + t] left-padded prompt, then the completion
    positions: torch.Tensor  # [n, p + t] position ids (0 at each row's first real token)
    attention: torch.Tensor  # [n, p + t, p + t] bool causal mask without the padding
    completions: torch.Tensor  # [n, t]
    mask: torch.Tensor  # [n, t] bool: the completion's tokens (up to and including the first stop token)
    advantages: torch.Tensor  # [n]
    ref_logprobs: torch.Tensor | None  # [n, t], when the loss has a KL term


# the key under which a row carries its index in the dataset (the seed of its completions), not passed to rewards
_INDEX = "dataset_index"


class _Indexed(Dataset):
    """The dataset's rows, each with its index under ``_INDEX``."""

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self._dataset[index], _INDEX: index}


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The data loader's collate: the rows as they are (prompts are padded once the completions are sampled)."""
    return batch


class GRPOFullFinetuneRecipeDistributed:
    """GRPO with every parameter trained, sharded with FSDP2 over the data-parallel ranks; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports any optimizer and LR scheduler by ``_component_``, gradient clipping, activation checkpointing and
    offloading, fp32/bf16, several reward functions, a KL penalty to a frozen reference, step and epoch
    checkpoints with exact resume (sampling is seeded by the step and the prompt), metric loggers, a progress bar and
    the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_grpo.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(
            cfg, distributed=True, unsupported=UNSUPPORTED
        )  # every problem at once, before anything is built
        self._check_grpo_config(cfg)
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu":
            training.configure_cpu_allocator()  # freed activations stay in the heap for the next step
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._fsdp_cpu_offload = cfg.fsdp_cpu_offload
        self._fsdp_reshard_after_forward = cfg.fsdp_reshard_after_forward
        self._save_every_n_steps = cfg.save_every_n_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._grpo_samples = cfg.grpo_samples
        self._ppo_epochs = cfg.ppo_epochs
        self._forward_batch_size = cfg.forward_batch_size
        self._max_generated_tokens = cfg.max_generated_tokens
        self._temperature = cfg.temperature
        self._top_k = cfg.top_k
        self._init_distributed(cfg)
        self._configured_seed = cfg.seed
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # GRPO steps taken (each makes ppo_epochs optimizer steps)
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)

    @staticmethod
    def _check_grpo_config(cfg: DictConfig) -> None:
        problems = []
        for key, low in (
            ("grpo_samples", 2),
            ("ppo_epochs", 1),
            ("forward_batch_size", 1),
            ("max_generated_tokens", 1),
        ):
            value = cfg.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                problems.append(config.ConfigProblem(key, f"must be an integer >= {low}", value))
        if cfg.get("gradient_accumulation_steps") != 1:
            problems.append(
                config.ConfigProblem(
                    "gradient_accumulation_steps",
                    "must be 1: a GRPO step optimises its whole batch of completions, in micro-batches of "
                    "forward_batch_size; lower forward_batch_size to save memory",
                    cfg.get("gradient_accumulation_steps"),
                )
            )
        if cfg.get("tensor_parallel_dim", 1) != 1:
            problems.append(
                config.ConfigProblem(
                    "tensor_parallel_dim",
                    "must be 1: the GRPO recipes shard with FSDP2 only",
                    cfg.get("tensor_parallel_dim"),
                )
            )
        if problems:
            raise config.ConfigError(problems)

    def _init_distributed(self, cfg: DictConfig) -> None:
        backend = cfg.dist_backend
        if backend is None and self._device.type == "cuda":
            backend = "cuda:nccl,cpu:gloo"  # NCCL for the model's tensors, gloo for CPU-side state (DCP)
        with config.errors_at("dist_backend", backend):
            training.init_distributed(backend)
        self._world_size, self._rank = dist.get_world_size(), dist.get_rank()
        self._is_rank_zero = self._rank == 0
        self._mesh = training.init_device_mesh(self._world_size, 1, self._device.type)
        self._dp_rank, self._dp_size = training.data_parallel_rank_and_size(self._mesh)
        log_info("%d processes, backend %s.", self._world_size, dist.get_backend())

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointers and reads the full model weights (every rank maps the same files).

        The checkpointer of the config reads the base model and writes the gathered outputs; the training state
        of a resumed run comes from the sharded checkpoints in ``output_dir/dcp``.

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
        the last step of the run, the sharded training state in ``output_dir/dcp/step_N/``. A collective.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        if self.global_step < self._total_steps:
            sharded = {
                training.MODEL_KEY: get_model_state_dict(self._model),
                training.OPT_KEY: get_optimizer_state_dict(self._model, self._optimizer),
                PROGRESS_KEY: self._progress_state(epoch),
            }
            self._dcp_checkpointer.save_checkpoint(
                sharded, epoch=self.epochs_run, step=self.global_step, config=self._cfg
            )
        full_state = training.gather_cpu_state_dict(self._model)  # a collective; only rank 0 receives it
        with training.errors_on_all_ranks():  # the others wait for rank 0's save, and stop with it if it fails
            if self._is_rank_zero:
                self._checkpointer.save_checkpoint(
                    {training.MODEL_KEY: full_state}, epoch=self.epochs_run, step=self.global_step, config=self._cfg
                )

    def _progress_state(self, epoch: int) -> dict[str, Any]:
        return training.progress_state(
            seed=self._seed,
            epochs_run=self.epochs_run,
            total_epochs=self._epochs,
            max_steps_per_epoch=self._max_steps_per_epoch,
            global_step=self.global_step,
            steps_in_epoch=self.global_step - epoch * self._steps_per_epoch,
            samples_per_step=self._batch_size,
            sampler=self._sampler,
            lr_scheduler=self._lr_scheduler,
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
            logger=log,
        )
        log_info("Resumed after %d GRPO steps (%d epochs complete).", self.global_step, self.epochs_run)

    def _load_sharded_state(self) -> None:
        # the optimizer state to load into: the fresh optimizer's, less the parameters without saved state
        optimizer_state = get_optimizer_state_dict(self._model, self._optimizer)
        saved = FileSystemReader(str(self._dcp_checkpointer.resume_dir)).read_metadata().state_dict_metadata
        prefix = f"{training.OPT_KEY}.state."
        stepped = {key[len(prefix) :].rsplit(".", 1)[0] for key in saved if key.startswith(prefix)}
        optimizer_state["state"] = {k: v for k, v in optimizer_state["state"].items() if k in stepped}
        state = {training.MODEL_KEY: get_model_state_dict(self._model), training.OPT_KEY: optimizer_state}
        self._dcp_checkpointer.load_checkpoint(state)  # each rank reads its own shards
        set_model_state_dict(self._model, state[training.MODEL_KEY])
        set_optimizer_state_dict(
            self._model, self._optimizer, state[training.OPT_KEY], options=StateDictOptions(strict=False)
        )

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model (and reference), tokenizer, optimizer, loss, rewards, data, LR scheduler
        and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        with training.errors_on_all_ranks():  # the logger writes on rank 0 only: its failure stops every rank
            self._metric_logger = config.instantiate(cfg.metric_logger)
            self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._loss_fn = config.instantiate(cfg.loss)
        self._model = self._setup_model(cfg, ckpt[training.MODEL_KEY])
        self._ref_model = None
        if getattr(self._loss_fn, "needs_reference", False):  # beta > 0: the starting model, frozen
            self._ref_model = self._setup_reference(cfg, ckpt[training.MODEL_KEY])
        del ckpt  # the memory-mapped full weights: every rank keeps only its shards
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._stop_tokens = list(self._tokenizer.stop_tokens)
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
        self._reward_functions, self._reward_weights = self._setup_rewards(cfg.reward_functions, cfg.reward_weights)
        self._batch_size = cfg.batch_size
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size)
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), 1, self._max_steps_per_epoch, self._dp_size
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        # the schedule counts optimizer steps: ppo_epochs per GRPO step
        self._lr_scheduler = config.instantiate_lr_scheduler(
            cfg.lr_scheduler, self._optimizer, self._total_steps * self._ppo_epochs
        )
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        if self._resume:
            self._restore_recipe_state()
        with training.errors_on_all_ranks():  # written by rank 0
            config.save_config(cfg, self._output_dir)

    def _setup_model(self, cfg: DictConfig, full_state_dict: dict[str, Any], frozen: bool = False) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        if self._enable_activation_checkpointing and not frozen:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        training.shard_model(
            model,
            training.family_shard_conditions(model, cfg.checkpointer.get("model_type")),
            cpu_offload=self._fsdp_cpu_offload,
            reshard_after_forward=self._fsdp_reshard_after_forward,
            dp_mesh=self._mesh["dp_shard"],
        )
        training.load_from_full_model_state_dict(
            model, full_state_dict, self._device, strict=True, cpu_offload=self._fsdp_cpu_offload
        )
        # the sampling policy and the policy being trained must score a sequence the same way
        training.disable_dropout(model)
        if frozen:
            model.requires_grad_(False)
            model.eval()
            return model
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())  # DTensors report their full sizes
        log_info("Model: %s parameters in %s, sharded over %d ranks.", f"{num_params:,}", self._dtype, self._world_size)
        return model

    def _setup_reference(self, cfg: DictConfig, full_state_dict: dict[str, Any]) -> nn.Module:
        # the checkpoint the run started from (a resumed policy comes from DCP afterwards), sharded like the policy
        reference = self._setup_model(cfg, full_state_dict, frozen=True)
        log_info("Reference model: a frozen, sharded copy of the starting checkpoint (loss.beta > 0).")
        return reference

    def _setup_rewards(self, cfg_rewards: ListConfig, weights: ListConfig | None) -> tuple[list[Any], list[float]]:
        if not isinstance(cfg_rewards, ListConfig) or len(cfg_rewards) == 0:
            raise config.ConfigError(
                config.ConfigProblem(
                    "reward_functions",
                    "must be a non-empty list of reward functions: _component_ entries (e.g. tune.rlhf.AnswerReward) "
                    "or dotted paths of functions (my_rewards.length_penalty)",
                )
            )
        # a string names a reward function by its dotted path; a _component_ node builds a reward object
        functions = [
            config.get_component_from_path(node, key=f"reward_functions[{i}]")
            if isinstance(node, str)
            else config.instantiate(node)
            for i, node in enumerate(cfg_rewards)
        ]
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions):
            raise config.ConfigError(
                config.ConfigProblem(
                    "reward_weights",
                    f"has {len(weights)} entries for {len(functions)} reward functions: one each, or null for 1 each",
                )
            )
        names = ", ".join(f"{rlhf.reward_name(f)} x {w:g}" for f, w in zip(functions, weights))
        log_info("Rewards: %s.", names)
        return functions, weights

    def _setup_data(
        self, cfg_dataset: DictConfig | ListConfig, shuffle: bool, batch_size: int
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate_dataset(cfg_dataset, self._tokenizer)
        if len(dataset) and "tokens" not in dataset[0]:
            raise config.ConfigError(
                config.ConfigProblem(
                    "dataset",
                    f"gives samples with keys {sorted(dataset[0])}; GRPO samples completions of prompts ('tokens', "
                    "plus the columns the rewards read). Use tune.datasets.prompt_dataset or gsm8k_dataset",
                    config.component_name(cfg_dataset),
                )
            )
        dataset = _Indexed(dataset)
        sampler = StatefulDistributedSampler(
            dataset, num_replicas=self._dp_size, rank=self._dp_rank, shuffle=shuffle, seed=self._seed
        )
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=_rows, drop_last=True)
        log_info(
            "Dataset %s: %d prompts, %d batches per rank.",
            config.component_name(cfg_dataset),
            len(dataset),
            len(loader),
        )
        return sampler, loader

    # ---------------------------------------------------------------------------------------------------- train

    def _micro_batches(self, num_sequences: int) -> list[slice]:
        step = self._forward_batch_size
        return [slice(start, min(start + step, num_sequences)) for start in range(0, num_sequences, step)]

    def _completion_logprobs(self, model: nn.Module, trajectory: Trajectory, rows: slice) -> torch.Tensor:
        """Per-token log-probabilities ``[rows, t]`` of the completions under ``model``."""
        prompt_len = trajectory.sequences.shape[1] - trajectory.completions.shape[1]
        logits = model(
            trajectory.sequences[rows], input_pos=trajectory.positions[rows], mask=trajectory.attention[rows]
        )
        # position i predicts token i + 1: the completion's logits start at the prompt's last position
        return rlhf.completion_log_probs(
            logits[:, prompt_len - 1 : -1], trajectory.completions[rows], self._temperature
        )

    @torch.no_grad()
    def generate_trajectory(self, rows: list[dict[str, Any]], metrics: dict[str, list]) -> Trajectory:
        """Samples ``grpo_samples`` completions of each prompt, scores them and computes their advantages.

        Args:
            rows (list[dict[str, Any]]): the batch's prompt rows (``tokens``, ``prompt`` and the other columns).
            metrics (dict[str, list]): where the step's reward and length statistics go (tensors, not read here).

        Returns:
            Trajectory: the scored batch, on the device.
        """
        group = self._grpo_samples
        prompts = [row["tokens"] for row in rows for _ in range(group)]  # a prompt's completions are consecutive
        generators = [  # one per completion: what a prompt samples does not depend on the batch it is in
            torch.Generator(self._device).manual_seed(_sampling_seed(self._seed, self.global_step, row[_INDEX], j))
            for row in rows
            for j in range(group)
        ]
        tokens, padding = generation.left_pad(prompts, self._tokenizer.pad_id, self._device)  # [n, p]
        pieces = []
        with self._gathered_for_generation():
            for rows_slice in self._micro_batches(len(prompts)):
                sequences, _ = generation.generate(
                    self._model,
                    tokens[rows_slice],
                    max_generated_tokens=self._max_generated_tokens,
                    pad_id=self._tokenizer.pad_id,
                    temperature=self._temperature,
                    top_k=self._top_k,
                    stop_tokens=self._stop_tokens,
                    rng=generators[rows_slice],
                    return_logits=False,
                )
                pieces.append(sequences[:, tokens.shape[1] :])
        width = max(piece.shape[1] for piece in pieces)  # a piece whose rows all stopped early is shorter
        completions = torch.cat(
            [nn.functional.pad(piece, (0, width - piece.shape[1]), value=self._tokenizer.pad_id) for piece in pieces]
        )
        mask = rlhf.completion_mask(completions, self._stop_tokens)  # [n, t]
        full_mask = torch.cat([padding, torch.ones_like(mask)], dim=1)
        # the rewards read text: decoding is this step's one host-device sync before logging (RL's, by nature)
        texts = [
            self._decode(row_tokens, row_mask) for row_tokens, row_mask in zip(completions.tolist(), mask.tolist())
        ]
        fields = {
            key: [row[key] for row in rows for _ in range(group)]
            for key in rows[0]
            if key not in ("tokens", "prompt", _INDEX)
        }
        prompt_texts = [row["prompt"] for row in rows for _ in range(group)]
        total, per_function = rlhf.score_completions(
            self._reward_functions, prompt_texts, texts, fields, self._reward_weights
        )
        advantages = rlhf.grpo_advantages(total, group).to(self._device)
        trajectory = Trajectory(
            sequences=torch.cat([tokens, completions], dim=1),
            positions=generation.get_position_ids_from_padding_mask(full_mask),
            attention=generation.get_causal_mask_from_padding_mask(full_mask),
            completions=completions,
            mask=mask,
            advantages=advantages,
            ref_logprobs=None,
        )
        if self._ref_model is not None:
            reference = [
                self._completion_logprobs(self._ref_model, trajectory, s) for s in self._micro_batches(len(prompts))
            ]
            trajectory = trajectory._replace(ref_logprobs=torch.cat(reference))
        metrics["reward"].append(total.mean())
        metrics["reward_std"].append(total.std())
        for function, column in zip(self._reward_functions, per_function.unbind(dim=1)):
            name = rlhf.reward_name(function)
            metrics[f"rewards/{name}/mean"].append(column.mean())
            metrics[f"rewards/{name}/std"].append(column.std())
        lengths = mask.sum(dim=1).float()
        metrics["completions/mean_length"].append(lengths.mean())
        stopped = torch.isin(completions, torch.tensor(self._stop_tokens, device=self._device)).any(dim=1)
        metrics["completions/clipped_ratio"].append((~stopped).float().mean())  # hit max_generated_tokens
        return trajectory

    @contextlib.contextmanager
    def _gathered_for_generation(self) -> Iterator[None]:
        """Keeps every FSDP unit's parameters gathered while generating: each rank stops generating when its own
        rows are done, so the per-forward all-gathers would not pair up across ranks."""
        units = [module for module in self._model.modules() if isinstance(module, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(self._fsdp_reshard_after_forward, recurse=False)

    def _decode(self, tokens: list[int], mask: list[bool]) -> str:
        kept = [t for t, keep in zip(tokens, mask) if keep]
        if kept and kept[-1] in self._stop_tokens:
            kept = kept[:-1]  # the stop token ends the completion; it is not part of its text
        try:
            return self._tokenizer.decode(kept)
        except (KeyError, IndexError, ValueError):
            # a sampled id past the tokenizer's vocabulary (the model's padded embedding rows, as Qwen2.5's
            # 151,936 rows for 151,665 tokens) has no text: it is left out
            return self._tokenizer.decode([t for t in kept if self._decodable(t)])

    def _decodable(self, token: int) -> bool:
        try:
            self._tokenizer.decode([token])
            return True
        except (KeyError, IndexError, ValueError):
            return False

    def grpo_step(self, trajectory: Trajectory, metrics: dict[str, list]) -> torch.Tensor:
        """``ppo_epochs`` optimizer steps on one scored batch, each over its micro-batches.

        Args:
            trajectory (Trajectory): from :meth:`generate_trajectory`.
            metrics (dict[str, list]): where the loss statistics go (tensors, not read here).

        Returns:
            torch.Tensor: the loss, averaged over the passes (0-d, not read here).
        """
        # the step's totals over every rank (collectives): the micro-batch losses of all ranks add up to the loss
        # of the whole batch; FSDP averages the gradients over the ranks, so each rank's share is scaled back up
        local_sequences = trajectory.completions.shape[0]
        num_sequences = local_sequences * self._dp_size  # every rank samples batch_size x grpo_samples
        num_tokens = training.all_reduce_sum(trajectory.mask.sum().float())
        micro_batches = self._micro_batches(local_sequences)
        old_logprobs: list[torch.Tensor | None] = [None] * len(micro_batches)
        losses = []
        for _ in range(self._ppo_epochs):
            pass_loss = torch.zeros((), dtype=torch.float32, device=self._device)
            num_clipped = torch.zeros((), dtype=torch.float32, device=self._device)
            kl_sum = torch.zeros((), dtype=torch.float32, device=self._device)
            for index, rows in enumerate(micro_batches):
                with self._activations_ctx:
                    logprobs = self._completion_logprobs(self._model, trajectory, rows)
                if old_logprobs[index] is None:
                    # first pass, no update yet: this IS the policy that sampled the batch (on-policy, ratio 1)
                    old_logprobs[index] = logprobs.detach()
                out = self._loss_fn(
                    logprobs,
                    old_logprobs[index],
                    trajectory.advantages[rows],
                    trajectory.mask[rows],
                    None if trajectory.ref_logprobs is None else trajectory.ref_logprobs[rows],
                    num_sequences=num_sequences,
                    num_tokens=num_tokens,
                )
                loss = out.loss * self._dp_size
                pass_loss += loss.detach()  # summed over ranks / dp_size: the batch's loss
                num_clipped += out.num_clipped
                kl_sum += out.kl_sum
                if index == len(micro_batches) - 1:
                    self._loss_check.record(pass_loss)
                loss.backward()  # FSDP reduce-scatters (averages) the gradients over the data-parallel ranks
            self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
            metrics["grad_norm"].append(self._optimizer_step())
            # this rank's shares of the step's values (over every rank's tokens): summed over ranks when logging
            metrics["clip_ratio/region_mean"].append(num_clipped / num_tokens.clamp(min=1))
            if trajectory.ref_logprobs is not None:
                metrics["kl"].append(kl_sum / num_tokens.clamp(min=1))
            losses.append(pass_loss)
        return torch.stack(losses).mean()

    def _optimizer_step(self) -> torch.Tensor:
        grad_norm = training.clip_grad_norm(self._model.parameters(), self._clip_grad_norm)  # over all shards
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm

    def train(self) -> None:
        """Runs the epochs: sample, score, optimise, log and save. Stops on a non-finite loss."""
        metrics: dict[str, list] = defaultdict(list)  # tensors since the last log, read when logging
        losses: list[torch.Tensor] = []
        throughput = training.ThroughputTracker()
        self._optimizer.zero_grad(set_to_none=True)
        self._profiler.start()
        for epoch in range(self.epochs_run, self._epochs):
            self._sampler.set_epoch(epoch)  # on resume the sampler skips what the first run consumed
            steps_done = self.global_step - epoch * self._steps_per_epoch
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                trajectory = self.generate_trajectory(next(batches), metrics)
                losses.append(self.grpo_step(trajectory, metrics))
                # tokens/s: the real tokens of every sequence the step generated and trained on
                throughput.update(trajectory.attention[:, -1].sum() - (~trajectory.mask).sum())
                self.global_step += 1
                pbar.update(1)
                if self.global_step % self._log_every_n_steps == 0:
                    self._log(metrics, losses, throughput, epoch, pbar)
                    metrics, losses = defaultdict(list), []
                end_of_epoch = self.global_step == (epoch + 1) * self._steps_per_epoch
                if end_of_epoch:
                    self.epochs_run = epoch + 1
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _log(self, metrics: dict[str, list], losses: list, throughput: Any, epoch: int, pbar: Any) -> None:
        """Logs the means since the last log (the loop's one host-device sync)."""
        grad_norms = metrics.pop("grad_norm")
        names = sorted(name for name, values in metrics.items() if values)  # the same on every rank
        # the means over every rank (one collective): reward statistics are per-rank means, the loss, clip
        # fraction and KL per-rank shares of the step's value
        local = [torch.stack(metrics[name]).float().mean().to(self._device) for name in names]
        local.append(torch.stack(losses).mean())
        tokens_per_second = throughput.compute()["tokens_per_second"]
        local.append(torch.tensor(tokens_per_second, dtype=torch.float32, device=self._device))
        summed = training.all_reduce_sum(torch.stack(local)).tolist()
        shares = {"clip_ratio/region_mean", "kl"}
        extra = {name: summed[i] / (1 if name in shares else self._dp_size) for i, name in enumerate(names)}
        values = training.step_metrics(
            loss=summed[-2] / self._dp_size,
            optimizer=self._optimizer,
            tokens_per_second=summed[-1],
            grad_norm=grad_norms[-1],
            extra=(extra,),
            memory_device=self._device if self._log_peak_memory_stats else None,
        )
        with training.errors_on_all_ranks():  # rank 0 writes; a failed write stops every rank
            self._metric_logger.log_dict(values, step=self.global_step)
        pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {values['loss']:.4f}")
        pbar.set_postfix(reward=f"{values['reward']:.3f}")

    def cleanup(self) -> None:
        """Closes the metric logger and the process group."""
        self._metric_logger.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _sampling_seed(seed: int, step: int, index: int, sample: int) -> int:
    """The seed of one completion's generator: distinct for every (step, prompt, completion), the same on resume
    and on any number of ranks."""
    return (((seed * 1_000_003 + step) * 1_000_033 + index) * 10_007 + sample) % (2**63)


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run --nproc_per_node N grpo_full_finetune_distributed --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="GRPOFullFinetuneRecipeDistributed", cfg=cfg)
    recipe = GRPOFullFinetuneRecipeDistributed(cfg)
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
