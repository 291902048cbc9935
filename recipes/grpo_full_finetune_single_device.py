"""Group Relative Policy Optimization (GRPO) of a whole language model on one device (CPU, one GPU or Apple MPS).

Each step takes ``batch_size`` prompts, samples ``grpo_samples`` completions of each with the KV-cache generation of
``tune.generation`` (temperature, top-k, the tokenizer's stop tokens), scores them with the configured reward
functions (``reward_functions``, weighed by ``reward_weights``), turns the rewards into group-normalised advantages
(``tune.rlhf.grpo_advantages``), and optimises the clipped GRPO loss (``tune.rlhf.loss.GRPOLoss``) ``ppo_epochs``
times over the batch, one optimizer step per pass, each accumulated over micro-batches of ``forward_batch_size``
completions. The first pass is on-policy: its log-probabilities are kept as the old policy's for the later passes,
whose ratios the loss clips. With ``loss.beta > 0`` a frozen copy of the starting model is the reference of the KL
penalty; with ``beta: 0`` (the default) no reference model is built.

The file reads top to bottom: ``__init__`` reads and checks the config, ``setup`` builds the pieces, ``train`` holds
the loop, ``generate_trajectory`` samples and scores a batch, ``grpo_step`` optimises it, ``save_checkpoint`` writes
``output_dir/step_N/``.

    tune run grpo_full_finetune_single_device --config qwen2_5/0.5B_full_grpo_single_device
    tune cp grpo_full_finetune_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import sys
from collections import defaultdict
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, generation, rlhf, training, utils
from tune.modules import TransformerSelfAttentionLayer
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["*/*_full_grpo_single_device", "demo/grpo*"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "optimizer_in_bwd": "every PPO pass over a batch takes one optimizer step after its micro-batches",
    "compile": "generation changes the sequence shapes at every step",
    "dataset_val": "there is no held-out loss in RL; evaluate the saved checkpoint with the generate or eval recipes",
    "run_val_every_n_steps": "there is no held-out loss in RL",
    "collate_fn": "prompts are left-padded by the recipe",
    "model_converters": "not supported by the GRPO recipes",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
}
GENERATION_RNG_KEY = "generation_rng"  # the sampling generator's state in recipe_state.pt

log = utils.get_logger(name="tune.recipes.grpo_full_finetune_single_device")


class Trajectory(NamedTuple):
    """A batch of sampled completions, scored: everything the optimisation passes need."""

    sequences: torch.Tensor  # [n, p + t] left-padded prompt, then the completion
    positions: torch.Tensor  # [n, p + t] position ids (0 at each row's first real token)
    attention: torch.Tensor  # [n, p + t, p + t] bool causal mask without the padding
    completions: torch.Tensor  # [n, t]
    mask: torch.Tensor  # [n, t] bool: the completion's tokens (up to and including the first stop token)
    advantages: torch.Tensor  # [n]
    ref_logprobs: torch.Tensor | None  # [n, t], when the loss has a KL term


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The data loader's collate: the rows as they are (prompts are padded once the completions are sampled)."""
    return batch


class GRPOFullFinetuneRecipeSingleDevice:
    """GRPO with every parameter trained, on a single device; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports any optimizer and LR scheduler by ``_component_``, gradient clipping, activation checkpointing and
    offloading, fp32/bf16, several reward functions, a KL penalty to a frozen reference, step and epoch
    checkpoints with exact resume (the sampling generator's state included), metric loggers, a progress bar and
    the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_grpo_single_device.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg, unsupported=UNSUPPORTED)  # every problem at once, before anything is built
        self._check_grpo_config(cfg)
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu" and training.configure_cpu_allocator():
            log.info("CPU: malloc keeps freed blocks for the next step (TUNE_CPU_ALLOCATOR=0 turns this off).")
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._save_every_n_steps = cfg.save_every_n_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._grpo_samples = cfg.grpo_samples
        self._ppo_epochs = cfg.ppo_epochs
        self._forward_batch_size = cfg.forward_batch_size
        self._max_generated_tokens = cfg.max_generated_tokens
        self._temperature = cfg.temperature
        self._top_k = cfg.top_k
        self._configured_seed = cfg.seed
        self._seed = training.set_seed(cfg.seed)
        # sampling draws from its own generator, saved with the checkpoint: a resumed run samples what the
        # uninterrupted run would
        self._rng = torch.Generator(device=self._device).manual_seed(self._seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # GRPO steps taken (each makes ppo_epochs optimizer steps)
        self._loss_check = training.FiniteLossCheck(self._device)

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
        if problems:
            raise config.ConfigError(problems)

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the model weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``; when resuming also the optimizer, LR
            scheduler, progress, data-loader position and RNG states (the sampling generator's included).
        """
        extra = {"resume_from_checkpoint": self._resume}
        if self._keep_last_n_checkpoints is not None:
            extra["keep_last_n_checkpoints"] = self._keep_last_n_checkpoints
        self._checkpointer = config.instantiate(cfg_checkpointer, **extra)
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: the model in its input format, the config and, unless this
        is the last step of the run, ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        intermediate = self.global_step < self._total_steps
        state = {training.MODEL_KEY: self._model.state_dict()}
        if intermediate:
            state[training.OPT_KEY] = self._optimizer.state_dict()
            state[GENERATION_RNG_KEY] = self._rng.get_state()
            state.update(
                training.progress_state(
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
            )
        self._checkpointer.save_checkpoint(
            state, epoch=self.epochs_run, step=self.global_step, intermediate_checkpoint=intermediate, config=self._cfg
        )

    def _restore_recipe_state(self, ckpt: dict[str, Any]) -> None:
        self.epochs_run, self.global_step, self._seed = training.restore_progress(
            ckpt,
            seed=self._configured_seed,  # null: the run's own, saved in the checkpoint
            max_steps_per_epoch=self._max_steps_per_epoch,
            sampler=self._sampler,
            load_optimizer=lambda: self._optimizer.load_state_dict(ckpt[training.OPT_KEY]),
            lr_scheduler=self._lr_scheduler,
            logger=log,
        )
        self._rng.set_state(ckpt[GENERATION_RNG_KEY])
        log.info("Resumed after %d GRPO steps (%d epochs complete).", self.global_step, self.epochs_run)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model (and reference), tokenizer, optimizer, loss, rewards, data, LR scheduler
        and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._loss_fn = config.instantiate(cfg.loss)
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY])
        self._ref_model = None
        if getattr(self._loss_fn, "needs_reference", False):  # beta > 0: the starting model, frozen
            self._ref_model = self._setup_reference(cfg.model, cfg.checkpointer)
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._stop_tokens = list(self._tokenizer.stop_tokens)
        self._optimizer = config.instantiate(cfg.optimizer, self._model.parameters())
        self._reward_functions, self._reward_weights = self._setup_rewards(cfg.reward_functions, cfg.reward_weights)
        self._batch_size = cfg.batch_size
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size)
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(len(self._dataloader), 1, self._max_steps_per_epoch)
        self._total_steps = self._epochs * self._steps_per_epoch
        # the schedule counts optimizer steps: ppo_epochs per GRPO step
        self._lr_scheduler = config.instantiate_lr_scheduler(
            cfg.lr_scheduler, self._optimizer, self._total_steps * self._ppo_epochs
        )
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        if self._resume:
            self._restore_recipe_state(ckpt)
        config.save_config(cfg, self._output_dir)

    def _setup_model(self, cfg_model: DictConfig, model_state_dict: dict[str, Any]) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        model.load_state_dict(model_state_dict)
        # the sampling policy and the policy being trained must score a sequence the same way
        training.disable_dropout(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())
        log.info("Model: %s parameters in %s on %s.", f"{num_params:,}", self._dtype, self._device)
        return model

    def _setup_reference(self, cfg_model: DictConfig, cfg_checkpointer: DictConfig) -> nn.Module:
        # the checkpoint the run started from (not a resumed one): a second checkpointer that never resumes
        reference_state = config.instantiate(cfg_checkpointer, resume_from_checkpoint=False).load_checkpoint()
        with training.set_default_dtype(self._dtype), self._device:
            reference = config.instantiate(cfg_model)
        reference.load_state_dict(reference_state[training.MODEL_KEY])
        training.disable_dropout(reference)
        reference.requires_grad_(False)
        reference.eval()
        log.info("Reference model: a frozen copy of the starting checkpoint (loss.beta > 0).")
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
        log.info("Rewards: %s.", names)
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
        sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=self._seed)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=_rows, drop_last=True)
        log.info("Dataset %s: %d prompts, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
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
        tokens, padding = generation.left_pad(prompts, self._tokenizer.pad_id, self._device)  # [n, p]
        pieces = []
        for rows_slice in self._micro_batches(len(prompts)):
            sequences, _ = generation.generate(
                self._model,
                tokens[rows_slice],
                max_generated_tokens=self._max_generated_tokens,
                pad_id=self._tokenizer.pad_id,
                temperature=self._temperature,
                top_k=self._top_k,
                stop_tokens=self._stop_tokens,
                rng=self._rng,
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
            key: [row[key] for row in rows for _ in range(group)] for key in rows[0] if key not in ("tokens", "prompt")
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
        num_sequences = trajectory.completions.shape[0]
        num_tokens = trajectory.mask.sum()
        micro_batches = self._micro_batches(num_sequences)
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
                pass_loss += out.loss.detach()  # the micro-batch losses add up to the batch's loss
                num_clipped += out.num_clipped
                kl_sum += out.kl_sum
                if index == len(micro_batches) - 1:
                    self._loss_check.record(pass_loss)
                out.loss.backward()
            self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
            metrics["grad_norm"].append(self._optimizer_step())
            metrics["clip_ratio/region_mean"].append(num_clipped / num_tokens.clamp(min=1))
            if trajectory.ref_logprobs is not None:
                metrics["kl"].append(kl_sum / num_tokens.clamp(min=1))
            losses.append(pass_loss)
        return torch.stack(losses).mean()

    def _optimizer_step(self) -> torch.Tensor:
        grad_norm = training.clip_grad_norm(
            [p for p in self._model.parameters() if p.requires_grad], self._clip_grad_norm
        )
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
        extra = {name: torch.stack(values).float().mean().item() for name, values in metrics.items() if values}
        values = training.step_metrics(
            loss=torch.stack(losses).mean().item(),
            optimizer=self._optimizer,
            tokens_per_second=throughput.compute()["tokens_per_second"],
            grad_norm=grad_norms[-1],
            extra=(extra,),
            memory_device=self._device if self._log_peak_memory_stats else None,
        )
        self._metric_logger.log_dict(values, step=self.global_step)
        pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {values['loss']:.4f}")
        pbar.set_postfix(reward=f"{values['reward']:.3f}")

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run grpo_full_finetune_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="GRPOFullFinetuneRecipeSingleDevice", cfg=cfg)
    recipe = GRPOFullFinetuneRecipeSingleDevice(cfg)
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
