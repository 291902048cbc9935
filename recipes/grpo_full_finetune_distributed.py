"""Group Relative Policy Optimization (GRPO) of a whole language model on several GPUs (FSDP2, torchrun).

What ``grpo_full_finetune_single_device`` does, with the model (and the reference, when ``loss.beta > 0``) sharded
over the data-parallel ranks: each rank takes ``batch_size`` prompts of the step, samples and scores their
``grpo_samples`` completions (a prompt's group stays on one rank, so its advantages need no other rank), and the
loss of the step is normalised over the completions (and tokens) of every rank, so that the gradient is the one
of the whole batch. Each completion is sampled from its own generator, seeded by the run's seed, the epoch, the
prompt's index in the dataset and the completion's number (``tune.rlhf.completion_generators``, the rule of every
GRPO recipe): a resumed run samples what the uninterrupted one would, and a prompt's completions do not depend on
the rank or micro-batch that generates them, so N ranks train as one device with N times the batch. Outputs:
``output_dir/step_N/`` (gathered to rank 0, the input's format) and the sharded training state in
``output_dir/dcp/step_N/``.

    tune run --nproc_per_node 8 grpo_full_finetune_distributed --config qwen3/4B_full_grpo
    tune cp grpo_full_finetune_distributed my_recipe.py   # then: tune run ... my_recipe.py --config my.yaml
"""

import contextlib
import logging
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from tune import config, generation, rlhf, training, utils
from tune.modules import TransformerSelfAttentionLayer
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": True,
    "configs": ["*/*_full_grpo"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "distributed", "grpo"],
}

# settings this recipe does not support, with the reason (reported with the other problems): off, or for a
# KeepDefault, the default of the key's table
UNSUPPORTED = {
    "dataset.packed": "prompts are generated from one by one; packing does not apply",
    "gradient_accumulation_steps": config.KeepDefault(
        "a GRPO step optimises its whole batch of completions, in micro-batches of forward_batch_size; lower "
        "forward_batch_size to save memory"
    ),
    "tensor_parallel_dim": config.KeepDefault("the GRPO recipes shard with FSDP2 only"),
    "context_parallel_dim": config.KeepDefault("generation needs each prompt's whole sequence on one rank"),
    "optimizer_in_bwd": "every PPO pass over a batch takes one optimizer step after its micro-batches",
    "fsdp_mixed_precision": "the GRPO recipes run the model in dtype",
    "compile": "generation changes the sequence shapes at every step",
    "dataset_val": "there is no held-out loss in RL; evaluate the saved checkpoint with the generate or eval recipes",
    "run_val_every_n_steps": "there is no held-out loss in RL",
    "collate_fn": "prompts are left-padded by the recipe",
    "model_converters": "not supported by the GRPO recipes",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
}

log = utils.get_logger(name="tune.recipes.grpo_full_finetune_distributed")


def log_info(message: str, *args: Any) -> None:
    """Logs on rank 0 only: every rank runs the same code, one copy of each line is enough."""
    utils.log_rank_zero(log, message % args if args else message)


class GRPOFullFinetuneRecipeDistributed:
    """GRPO with every parameter trained, sharded with FSDP2 over the data-parallel ranks; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports any optimizer and LR scheduler by ``_component_``, gradient clipping, activation checkpointing and
    offloading, fp32/bf16, several reward functions, a KL penalty to a frozen reference, step and epoch
    checkpoints with exact resume (each completion is sampled from its own generator, seeded by the run's seed, the
    epoch, the prompt's dataset index and the completion's number: ``tune.rlhf.completion_generators``), metric
    loggers, a progress bar and the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_grpo.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        # every problem at once, before anything is built (the "grpo" table checks the group size and rewards)
        config.check_training_config(
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
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._fsdp_cpu_offload = cfg.fsdp_cpu_offload
        self._fsdp_reshard_after_forward = cfg.fsdp_reshard_after_forward  # between generation and training
        self._save_every_n_steps = cfg.save_every_n_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._grpo_samples = cfg.grpo_samples
        self._ppo_epochs = cfg.ppo_epochs
        self._forward_batch_size = cfg.forward_batch_size
        self._max_generated_tokens = cfg.max_generated_tokens
        self._temperature = cfg.temperature
        self._top_k = cfg.top_k
        self._dims = config.init_parallel(cfg, self._device)  # process group and device meshes
        self._seed = training.set_seed(training.sync_seed(cfg.seed))  # the same on every rank
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # GRPO steps taken (each makes ppo_epochs optimizer steps)
        # a NaN/inf loss on any rank stops every rank at the same step
        self._loss_check = training.FiniteLossCheck(self._device, all_reduce=training.all_reduce_sum)

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
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=False, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` (the model in its input format, gathered to rank 0) and, unless this is
        the last step of the run, the sharded training state in ``output_dir/dcp/step_N/``. A collective.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

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
        self._rewards = self._setup_rewards(cfg.reward_functions, cfg.reward_weights)
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size)
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), 1, self._max_steps_per_epoch, self._dims.dp_size
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        # the schedule counts optimizer steps: ppo_epochs per GRPO step
        self._lr_scheduler = config.instantiate_lr_scheduler(
            cfg.lr_scheduler, self._optimizer, self._total_steps * self._ppo_epochs
        )
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

    def _setup_model(self, cfg: DictConfig, full_state_dict: dict[str, Any], frozen: bool = False) -> nn.Module:
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)  # no memory yet: each rank materialises only its shards
        if self._enable_activation_checkpointing and not frozen:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        config.shard_model(cfg, model, self._dims, self._checkpointer.model_family)  # FSDP2, as the config says
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
        log_info(
            "Model: %s parameters in %s, sharded over %d ranks.", f"{num_params:,}", self._dtype, self._dims.world_size
        )
        return model

    def _setup_reference(self, cfg: DictConfig, full_state_dict: dict[str, Any]) -> nn.Module:
        # the checkpoint the run started from (a resumed policy comes from DCP afterwards), sharded like the policy
        reference = self._setup_model(cfg, full_state_dict, frozen=True)
        log_info("Reference model: a frozen, sharded copy of the starting checkpoint (loss.beta > 0).")
        return reference

    def _setup_rewards(self, cfg_rewards: ListConfig, weights: ListConfig | None) -> rlhf.WeightedRewards:
        # a string names a reward function by its dotted path; a _component_ node builds a reward object
        functions = [
            config.get_component_from_path(node, key=f"reward_functions[{i}]")
            if isinstance(node, str)
            else config.instantiate(node)
            for i, node in enumerate(cfg_rewards)
        ]
        with config.errors_at("reward_functions"):
            rewards = rlhf.WeightedRewards(functions, weights)
        log_info("Rewards: %s.", rewards)
        return rewards

    def _setup_data(
        self, cfg_dataset: DictConfig | ListConfig, shuffle: bool, batch_size: int
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate_dataset(cfg_dataset, self._tokenizer)
        with config.errors_at("dataset", config.component_name(cfg_dataset)):
            rlhf.check_prompt_dataset(dataset)
        dataset = rlhf.IndexedPrompts(dataset)  # a row's index seeds its completions
        sampler = StatefulDistributedSampler(
            dataset, num_replicas=self._dims.dp_size, rank=self._dims.dp_rank, shuffle=shuffle, seed=self._seed
        )
        # the rows as they are: prompts are padded once their completions are sampled
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=list, drop_last=True)
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

    @torch.no_grad()
    def generate_trajectory(
        self, rows: list[dict[str, Any]], epoch: int, metrics: dict[str, list]
    ) -> rlhf.GRPOTrajectory:
        """Samples ``grpo_samples`` completions of each prompt, scores them and computes their advantages.

        Args:
            rows (list[dict[str, Any]]): the batch's prompt rows (``tokens``, ``prompt``, the dataset index and the
                columns the rewards read).
            epoch (int): the epoch being trained (0-based): with the seed and the rows' indices, it seeds sampling.
            metrics (dict[str, list]): where the step's reward and length statistics go (tensors, not read here).

        Returns:
            rlhf.GRPOTrajectory: the scored batch, on the device.
        """
        group, pad_id = self._grpo_samples, self._tokenizer.pad_id
        prompts = [row["tokens"] for row in rows for _ in range(group)]  # a prompt's completions are consecutive
        # one generator per completion: what a prompt samples depends neither on its batch nor on a saved state
        indices = [row[rlhf.DATASET_INDEX_KEY] for row in rows]
        generators = rlhf.completion_generators(self._seed, epoch, indices, group, self._device)
        tokens, padding = generation.left_pad(prompts, pad_id, self._device)  # [n, p]
        generated = []
        with self._gathered_for_generation():
            for micro_batch in self._micro_batches(len(prompts)):
                sequences, _ = generation.generate(
                    self._model,
                    tokens[micro_batch],
                    max_generated_tokens=self._max_generated_tokens,
                    pad_id=pad_id,
                    temperature=self._temperature,
                    top_k=self._top_k,
                    stop_tokens=self._stop_tokens,
                    rng=generators[micro_batch],
                    return_logits=False,
                )
                generated += sequences[:, tokens.shape[1] :].unbind()
        # [n, t]: a micro-batch whose rows all stopped early is shorter, padded here
        completions = pad_sequence(generated, batch_first=True, padding_value=pad_id)
        mask = rlhf.completion_mask(completions, self._stop_tokens)  # [n, t]
        # the rewards read text: decoding is this step's one host-device sync before logging (RL's, by nature)
        texts = rlhf.decode_completions(self._tokenizer, completions, mask, self._stop_tokens)
        total, per_function = self._rewards.score(rows, texts, group)
        advantages = rlhf.grpo_advantages(total, group).to(self._device)
        trajectory = rlhf.grpo_trajectory(tokens, padding, completions, mask, advantages)
        if self._ref_model is not None:
            reference = [self._log_probs(self._ref_model, trajectory, s) for s in self._micro_batches(len(prompts))]
            trajectory = trajectory._replace(ref_logprobs=torch.cat(reference))
        stats = rlhf.grpo_metrics(total, per_function, self._rewards.names, completions, mask, self._stop_tokens)
        for name, value in stats.items():
            metrics[name].append(value)
        return trajectory

    def _log_probs(self, model: nn.Module, trajectory: rlhf.GRPOTrajectory, rows: slice) -> torch.Tensor:
        return rlhf.trajectory_log_probs(model, trajectory, rows, self._temperature)

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

    def grpo_step(self, trajectory: rlhf.GRPOTrajectory, metrics: dict[str, list]) -> torch.Tensor:
        """``ppo_epochs`` optimizer steps on one scored batch, each over its micro-batches.

        Args:
            trajectory (rlhf.GRPOTrajectory): from :meth:`generate_trajectory`.
            metrics (dict[str, list]): where the loss statistics go (tensors, not read here).

        Returns:
            torch.Tensor: the loss, averaged over the passes (0-d, not read here).
        """
        micro_batches = self._micro_batches(trajectory.completions.shape[0])
        # the loss divides by the step's completions and tokens. step_loss_scale is world_size / (every rank's total):
        # each rank divides by its share, so the ranks' averaged gradients are the whole batch's (one device: total)
        num_sequences = 1 / training.step_loss_scale(torch.tensor(len(trajectory.completions), device=self._device))
        num_tokens = 1 / training.step_loss_scale(trajectory.mask.sum())
        old_logprobs: list[torch.Tensor | None] = [None] * len(micro_batches)
        losses = []
        for _ in range(self._ppo_epochs):
            pass_loss = torch.zeros((), dtype=torch.float32, device=self._device)
            num_clipped = torch.zeros((), dtype=torch.float32, device=self._device)
            kl_sum = torch.zeros((), dtype=torch.float32, device=self._device)
            for index, rows in enumerate(micro_batches):
                with self._activations_ctx:
                    logprobs = self._log_probs(self._model, trajectory, rows)
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
                pass_loss += out.loss.detach()  # this rank's share: summed over ranks / world size, the batch's loss
                num_clipped += out.num_clipped
                kl_sum += out.kl_sum
                if index == len(micro_batches) - 1:
                    self._loss_check.record(pass_loss)
                out.loss.backward()  # FSDP reduce-scatters (averages) the gradients over the data-parallel ranks
            self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
            metrics["grad_norm"].append(self._optimizer_step())
            # like the loss: this rank's shares of the step's values, averaged over the ranks when logging
            metrics["clip_ratio/region_mean"].append(num_clipped / num_tokens)
            if trajectory.ref_logprobs is not None:
                metrics["kl"].append(kl_sum / num_tokens)
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
                trajectory = self.generate_trajectory(next(batches), epoch, metrics)
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
        # fraction and KL per-rank shares of the step's value (times the world size)
        local = [torch.stack(metrics[name]).float().mean().to(self._device) for name in names]
        local.append(torch.stack(losses).mean())
        tokens_per_second = throughput.compute()["tokens_per_second"]
        local.append(torch.tensor(tokens_per_second, dtype=torch.float32, device=self._device))
        summed = training.all_reduce_sum(torch.stack(local)).tolist()
        extra = {name: summed[i] / self._dims.dp_size for i, name in enumerate(names)}
        values = training.step_metrics(
            loss=summed[-2] / self._dims.dp_size,
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
