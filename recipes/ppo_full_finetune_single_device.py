"""Full fine-tuning with Proximal Policy Optimisation (PPO) against a reward model, on one device.

Four models: the policy (trained), a frozen copy of it as the reference, a value model initialised from the
reward model (trained with the policy, by the same optimizer), and the frozen reward model (a sequence
classifier with one output, e.g. ``tune.models.mistral.mistral_classifier`` with ``num_classes: 1``, loaded from a
Hugging Face ``*ForSequenceClassification`` checkpoint with ``model_type: REWARD``). Each step:

1. generates a response to each prompt of the batch with the policy (KV-cache generation, ``forward_batch_size``
   prompts at a time), cuts it after its first stop token, and scores (prompt, response) with the reward model
   at the response's last token; responses that never stopped or are shorter than ``min_response_length`` get
   ``reward_penalty`` instead;
2. computes per-token rewards (the score at the last token, minus ``kl_coeff`` times the log-ratio to the
   reference at every token: ``tune.rlhf.get_rewards_ppo``), advantages and returns by GAE
   (``tune.rlhf.estimate_advantages``, advantages whitened over the response tokens);
3. runs ``ppo_epochs`` passes over the batch in shuffled minibatches of ``ppo_batch_size``, one optimizer step
   each (``gradient_accumulation_steps`` micro-batches per minibatch), minimising ``tune.rlhf.loss.PPOLoss``.

``num_steps`` counts trajectories (prompts), as in torchtune: the run takes ``num_steps // batch_size`` PPO
steps. The policy is saved to ``output_dir/step_N/`` (with ``recipe_state.pt`` to resume from), the value model
to ``value_checkpointer.output_dir/step_N/``, both in their input format.

Where this differs from torchtune 0.6.1's recipe: the score is added at the last response token (torchtune: one
position after it) and values are kept on the response tokens only; log-probabilities of the generated tokens are
recomputed with a forward pass (not taken from the generation logits), so the first PPO ratio is exactly 1; a
response whose stop token is its last generated token counts as stopped; ``response_lengths`` are lengths, not
last indices; micro-batches weigh by their response tokens, so the loss of a minibatch is the same whatever
``gradient_accumulation_steps``; metrics are logged once per PPO step at step N.

    tune run ppo_full_finetune_single_device --config mistral/7B_full_ppo_low_memory
    tune cp ppo_full_finetune_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import math
import sys
import time
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader

from tune import config, generation, rlhf, training, utils
from tune.data import padded_collate
from tune.modules import TransformerSelfAttentionLayer
from tune.rlhf import PPOStats, Trajectory
from tune.training.checkpointing import StatefulDistributedSampler

RECIPE_INFO = {
    "supports_distributed": False,
    "configs": ["*/*_full_ppo_low_memory", "*/*_full_ppo_single_device"],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "prompts are generated from one by one; packing does not apply",
    "collate_fn": "prompts are left-padded by the recipe for generation",
    "dataset_val": "PPO has no validation loss; watch the logged scores",
    "run_val_every_n_steps": "PPO has no validation loss; watch the logged scores",
    "model_converters": "the policy is fully fine-tuned",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
    "enable_activation_offloading": "use enable_activation_checkpointing",
}

log = utils.get_logger(name="tune.recipes.ppo_full_finetune_single_device")
_RNG_KEY = "ppo_rng_state"  # recipe-state entry of the generator that samples responses and orders minibatches


class PPOFullFinetuneRecipeSingleDevice:
    """PPO of a fully fine-tuned policy and a value model on one device; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports ``forward_batch_size`` (generation batches), ``ppo_batch_size`` minibatches with gradient
    accumulation, gradient clipping, any optimizer and LR scheduler by ``_component_`` (stepped per minibatch),
    ``optimizer_in_bwd``, activation checkpointing, ``compile``, fp32/bf16, KV-cache generation with stop tokens,
    step and epoch checkpoints with exact resume, metric loggers, a progress bar and the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_full_ppo_*.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg, unsupported=UNSUPPORTED)  # every problem at once, before anything is built
        _check_ppo_config(cfg)
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._dtype == torch.float16:
            raise config.ConfigError(config.ConfigProblem("dtype", "fp16 is not supported; use bf16 or fp32", "fp16"))
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._compile = cfg.compile
        self._optimizer_in_bwd = cfg.optimizer_in_bwd
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._save_every_n_steps = cfg.save_every_n_steps
        # batch sizes: trajectories per step, per generation pass, per optimizer step, per backward pass
        self._batch_size = cfg.batch_size
        self._forward_batch_size = cfg.forward_batch_size
        self._ppo_batch_size = cfg.ppo_batch_size
        self._ppo_backward_batch_size = cfg.ppo_batch_size // cfg.gradient_accumulation_steps
        self._ppo_epochs = cfg.ppo_epochs
        self._total_steps = cfg.num_steps // cfg.batch_size
        # generation, rewards and advantages
        self._enable_kv_cache = cfg.enable_kv_cache
        self._max_generated_tokens = cfg.max_generated_tokens
        self._temperature = cfg.temperature
        self._top_k = cfg.top_k
        self._min_response_length = cfg.min_response_length
        self._penalise_no_eos = cfg.penalise_no_eos
        self._reward_penalty = cfg.reward_penalty
        self._whiten_rewards = cfg.whiten_rewards
        self._kl_coeff = cfg.kl_coeff
        self._gamma = cfg.gamma
        self._lmbda = cfg.lmbda
        self._seed = training.set_seed(cfg.seed)
        # sampling and minibatch order draw from their own generator, saved with the recipe state: the data
        # loader draws from the global one whenever an epoch starts, which a resumed run does at another point
        self._rng = torch.Generator(self._device).manual_seed(self._seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # PPO steps taken (trajectory batches), each of several optimizer steps
        self._loss_check = training.FiniteLossCheck(self._device)

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the policy's checkpointer and reads its weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the policy's state under ``training.MODEL_KEY``; when resuming also the optimizer, LR
            scheduler, progress, data-loader position and RNG states.
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=self._resume, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def load_value_checkpoint(self, cfg_value_checkpointer: DictConfig) -> dict[str, Any]:
        """Reads the value model's weights: the reward model's at the start, the saved value model when resuming
        (from the ``step_N`` directory of the policy checkpoint being resumed).

        Args:
            cfg_value_checkpointer (DictConfig): the ``value_checkpointer`` section.

        Returns:
            dict[str, Any]: the value model's state under ``training.MODEL_KEY``.
        """
        extra: dict[str, Any] = {"resume_from_checkpoint": False}
        if self._keep_last_n_checkpoints is not None:
            extra["keep_last_n_checkpoints"] = self._keep_last_n_checkpoints
        if self._resume:
            saved = Path(cfg_value_checkpointer.output_dir) / self._checkpointer.resume_dir.name
            if not saved.is_dir():
                raise config.ConfigError(
                    config.ConfigProblem(
                        "value_checkpointer.output_dir",
                        f"holds no {saved.name}/ to resume the value model from, though the policy resumes from "
                        f"{self._checkpointer.resume_dir}; point it at the value models of the same run",
                        str(cfg_value_checkpointer.output_dir),
                    )
                )
            extra.update(checkpoint_dir=str(saved), checkpoint_files=None)  # the saved files, whatever the input's
        self._value_checkpointer = config.instantiate(cfg_value_checkpointer, **extra)
        return self._value_checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes the value model to ``value_checkpointer.output_dir/step_N/``, then the policy to
        ``output_dir/step_N/`` with the config and, unless this is the last step, ``recipe_state.pt``; the policy's
        checkpoint, written last, is the one a resumed run looks for.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._value_checkpointer.save_checkpoint(
            {training.MODEL_KEY: self._value_model.state_dict()}, epoch=self.epochs_run, step=self.global_step
        )
        self._recipe_state.save(
            epoch=epoch,
            epochs_run=self.epochs_run,
            global_step=self.global_step,
            config=self._cfg,
            extra={_RNG_KEY: self._rng.get_state()},
        )

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, the four models, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._policy_model = self._setup_model(cfg.policy_model, ckpt[training.MODEL_KEY], trainable=True)
        ref_state = config.instantiate(cfg.ref_policy_checkpointer, resume_from_checkpoint=False).load_checkpoint()
        self._ref_policy_model = self._setup_model(cfg.policy_model, ref_state[training.MODEL_KEY], trainable=False)
        value_state = self.load_value_checkpoint(cfg.value_checkpointer)[training.MODEL_KEY]
        self._value_model = self._setup_model(cfg.reward_and_value_model, value_state, trainable=True, value=True)
        reward_ckpt = config.instantiate(cfg.reward_checkpointer, resume_from_checkpoint=False).load_checkpoint()
        self._reward_model = self._setup_model(cfg.reward_and_value_model, reward_ckpt[training.MODEL_KEY], False)
        del ckpt[training.MODEL_KEY], ref_state, value_state, reward_ckpt
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._stop_token_ids = self._setup_stop_tokens(cfg.stop_token_ids)
        self._optimizer = self._setup_optimizer(cfg.optimizer)
        self._loss_fn = config.instantiate(cfg.loss)
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size)
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(len(self._dataloader), 1, None)
        self._total_epochs = math.ceil(self._total_steps / self._steps_per_epoch)
        optimizer_steps = self._total_steps * self._ppo_epochs * (self._batch_size // self._ppo_batch_size)
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, optimizer_steps)
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        self._recipe_state = training.RecipeState(  # what a save writes and a resume restores
            self._policy_model,
            self._optimizer,
            checkpointer=self._checkpointer,
            sampler=self._sampler,
            seed=self._seed,
            epochs=self._total_epochs,
            steps_per_epoch=self._steps_per_epoch,
            max_steps_per_epoch=None,
            samples_per_step=self._batch_size,
            lr_scheduler=self._lr_scheduler,
            total_steps=self._total_steps,
        )
        if self._resume:
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(ckpt, cfg.seed, log)
            self._rng.set_state(ckpt[_RNG_KEY])  # the generator that samples responses and orders minibatches
        log.info(
            "PPO: %d steps of %d trajectories (%d epochs of %d steps), %d PPO epochs of %d minibatches each.",
            self._total_steps,
            self._batch_size,
            self._total_epochs,
            self._steps_per_epoch,
            self._ppo_epochs,
            self._batch_size // self._ppo_batch_size,
        )
        config.save_config(cfg, self._output_dir)

    def _setup_model(
        self, cfg_model: DictConfig, state_dict: dict[str, Any], trainable: bool, value: bool = False
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        if value:  # a value model may start from a language model's checkpoint: its head is then a fresh one
            training.update_state_dict_for_classifier(state_dict, model.named_parameters())
        model.load_state_dict(state_dict)
        # the policy must score its tokens as it sampled them, and the value model must be deterministic
        training.disable_dropout(model)
        if not trainable:
            model.eval().requires_grad_(False)
        elif self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        if self._compile:
            training.compile_model(model, verbose=False)
        num_params = sum(p.numel() for p in model.parameters())
        kind = "trainable" if trainable else "frozen"
        log.info("%s: %s %s parameters in %s.", config.component_name(cfg_model), f"{num_params:,}", kind, self._dtype)
        return model

    def _setup_stop_tokens(self, stop_token_ids: ListConfig | None) -> torch.Tensor:
        if stop_token_ids:
            ids = list(stop_token_ids)
            if self._tokenizer.eos_id not in ids:
                log.warning("stop_token_ids %s lack the tokenizer's eos_id %d.", ids, self._tokenizer.eos_id)
        else:  # the tokenizer's own (EOS and end-of-turn tokens)
            ids = list(getattr(self._tokenizer, "stop_tokens", None) or [self._tokenizer.eos_id])
        self._stop_token_list = ids  # for generation, which compares on the host's copy
        return torch.tensor(ids, dtype=torch.long, device=self._device)

    def _setup_optimizer(self, cfg_optimizer: DictConfig) -> torch.optim.Optimizer:
        if self._optimizer_in_bwd:
            # one optimizer per parameter, stepped by a hook as soon as that parameter's gradient is ready
            named = chain(
                (("policy." + n, p) for n, p in self._policy_model.named_parameters()),
                (("value." + n, p) for n, p in self._value_model.named_parameters()),
            )
            return training.OptimizerInBackward(named, partial(config.instantiate, cfg_optimizer))
        return config.instantiate(cfg_optimizer, self._trainable_params())

    def _setup_data(
        self, cfg_dataset: DictConfig | ListConfig, shuffle: bool, batch_size: int
    ) -> tuple[StatefulDistributedSampler, DataLoader]:
        dataset = config.instantiate_dataset(cfg_dataset, self._tokenizer)  # a list is concatenated
        sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=self._seed)
        # prompts are left-padded: the generated tokens of every row start at the same position
        collate = partial(
            padded_collate, pad_direction="left", keys_to_pad=["tokens", "labels"], padding_idx=self._tokenizer.pad_id
        )
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate, drop_last=True)
        log.info("Dataset %s: %d prompts, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
        return sampler, loader

    # ----------------------------------------------------------------------------------------------- trajectory

    def _response_logprobs(
        self, model: nn.Module, trajectory_inputs: tuple[torch.Tensor, ...], context_length: int
    ) -> torch.Tensor:
        query_responses, masks, position_ids = trajectory_inputs
        logits = model(query_responses, mask=masks, input_pos=position_ids)
        logits = rlhf.truncate_sequence_for_logprobs(logits, context_length).float()  # [b, r, v]
        return rlhf.logits_to_logprobs(logits, query_responses[:, context_length:], self._temperature)

    def _per_position_scores(self, model: nn.Module, trajectory_inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        query_responses, masks, position_ids = trajectory_inputs
        return model(query_responses, mask=masks, input_pos=position_ids)[..., 0].float()  # [b, s]

    @torch.no_grad()
    def generate_trajectory(self, input_ids: torch.Tensor) -> Trajectory:
        """Generates responses to a batch of left-padded prompts and scores them (see the module docstring).

        Args:
            input_ids (torch.Tensor): ``[b, prompt_len]`` prompts, left-padded with the tokenizer's ``pad_id``.

        Returns:
            Trajectory: the batch, with ``seq_lens`` the response lengths (stop token included) and
            ``value_seq_idxs`` their last positions, where the scores are added.
        """
        pad_id = self._tokenizer.pad_id
        context_length = input_ids.shape[1]
        query_responses, _ = generation.generate(
            self._policy_model,
            input_ids,
            max_generated_tokens=self._max_generated_tokens,
            pad_id=pad_id,
            temperature=self._temperature,
            top_k=self._top_k,
            stop_tokens=self._stop_token_list,
            rng=self._rng,
            return_logits=False,
            use_cache=self._enable_kv_cache,
        )
        # generation ends early once every row stopped: pad so that all batches have the full length
        query_responses = F.pad(
            query_responses, (0, context_length + self._max_generated_tokens - query_responses.shape[1])
        )
        response_padding_masks, responses = rlhf.truncate_sequence_at_first_stop_token(
            query_responses[:, context_length:].clone(), self._stop_token_ids, pad_id
        )
        query_responses = torch.cat([input_ids, responses], dim=1)
        # only the prompt's leading pad tokens are padding; every response position is attended (causally)
        prompt_mask = (input_ids != pad_id).long().cumsum(dim=-1) > 0
        padding_mask = torch.cat([prompt_mask, torch.ones_like(responses, dtype=torch.bool)], dim=1)
        masks = generation.get_causal_mask_from_padding_mask(padding_mask)  # [b, s, s]
        position_ids = generation.get_position_ids_from_padding_mask(padding_mask)  # [b, s]
        inputs = (query_responses, masks, position_ids)

        logprobs = self._response_logprobs(self._policy_model, inputs, context_length)
        ref_logprobs = self._response_logprobs(self._ref_policy_model, inputs, context_length)
        # the value of the state before each response token: the value model's output one position earlier
        values = self._per_position_scores(self._value_model, inputs)[:, context_length - 1 : -1]
        seq_lens = (~response_padding_masks).sum(dim=-1)  # response lengths, the stop token included
        value_seq_idxs = seq_lens - 1  # the last response token: where the sequence's score arrives
        scores = self._per_position_scores(self._reward_model, inputs)
        scores = scores.gather(1, (context_length + value_seq_idxs)[:, None]).squeeze(1)  # [b]
        # get_reward_penalty_mask reads "stopped" as "has padding": a stop token in the last slot stopped too
        stopped = torch.isin(responses, self._stop_token_ids).any(dim=-1, keepdim=True)
        penalised = rlhf.get_reward_penalty_mask(stopped, seq_lens, self._penalise_no_eos, self._min_response_length)
        scores = scores.masked_fill(penalised, self._reward_penalty)

        # nothing after the stop token counts: equal log-probs there give a zero KL penalty, zero values no return
        logprobs = logprobs.masked_fill(response_padding_masks, 0.0)
        ref_logprobs = ref_logprobs.masked_fill(response_padding_masks, 0.0)
        values = values.masked_fill(response_padding_masks, 0.0)
        return Trajectory(
            query_responses=query_responses,
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            values=values,
            masks=masks,
            position_ids=position_ids,
            response_padding_masks=response_padding_masks,
            value_padding_masks=response_padding_masks.clone(),
            value_seq_idxs=value_seq_idxs,
            scores=scores,
            seq_lens=seq_lens,
        )

    def generate_trajectory_batched(self, input_ids: torch.Tensor) -> Trajectory:
        """:meth:`generate_trajectory` on ``forward_batch_size`` prompts at a time, concatenated."""
        parts = [self.generate_trajectory(chunk) for chunk in input_ids.split(self._forward_batch_size)]
        return Trajectory(*map(torch.cat, zip(*parts)))

    # ---------------------------------------------------------------------------------------------------- train

    def ppo_step(
        self,
        trajectory: Trajectory,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        context_length: int,
        loss_scale: torch.Tensor | float = 1.0,
    ) -> PPOStats:
        """Forward passes, PPO loss and backward of one micro-batch. Override this in a copied recipe to change
        the objective.

        Args:
            trajectory (Trajectory): the micro-batch's trajectories.
            advantages (torch.Tensor): their advantages ``[b, r]``.
            returns (torch.Tensor): their returns ``[b, r]``.
            context_length (int): the prompt length.
            loss_scale (torch.Tensor | float): this micro-batch's share of its minibatch's response tokens.

        Returns:
            PPOStats: the scaled loss and statistics (detached), to be summed over the minibatch.
        """
        inputs = (trajectory.query_responses, trajectory.masks, trajectory.position_ids)
        pi_logprobs = self._response_logprobs(self._policy_model, inputs, context_length)
        pi_logprobs = pi_logprobs.masked_fill(trajectory.response_padding_masks, 0.0)
        phi_values = self._per_position_scores(self._value_model, inputs)[:, context_length - 1 : -1]
        phi_values = phi_values.masked_fill(trajectory.value_padding_masks, 0.0)
        loss, policy_loss, value_loss, ratios, clipfrac = self._loss_fn(
            trajectory.logprobs,
            pi_logprobs,
            advantages,
            trajectory.values,
            phi_values,
            returns,
            padding_masks=~trajectory.response_padding_masks,
            value_padding_masks=~trajectory.value_padding_masks,
        )
        loss = loss * loss_scale
        loss.backward()
        with torch.no_grad():
            approx_policy_kls = 0.5 * rlhf.masked_mean(
                (pi_logprobs - trajectory.logprobs).pow(2), ~trajectory.response_padding_masks
            )
        scaled = (policy_loss, value_loss, ratios, clipfrac, approx_policy_kls)
        return PPOStats(loss.detach(), *(value * loss_scale for value in scaled))

    def _ppo_updates(
        self, trajectory: Trajectory, advantages: torch.Tensor, returns: torch.Tensor, context_length: int
    ) -> tuple[PPOStats, torch.Tensor | None]:
        """``ppo_epochs`` passes over the trajectories in shuffled minibatches, one optimizer step each."""
        per_minibatch, grad_norm = [], None
        response_tokens = (~trajectory.response_padding_masks).sum(dim=-1)  # [b]
        for _ in range(self._ppo_epochs):
            order = torch.randperm(self._batch_size, device=self._device, generator=self._rng)
            for minibatch in order.split(self._ppo_batch_size):
                num_tokens = response_tokens[minibatch].sum()  # the minibatch's loss is a mean over these tokens
                totals = None
                for micro in minibatch.split(self._ppo_backward_batch_size):
                    part = Trajectory(*(field.index_select(0, micro) for field in trajectory))
                    share = response_tokens[micro].sum() / num_tokens
                    stats = self.ppo_step(part, advantages[micro], returns[micro], context_length, share)
                    totals = stats if totals is None else PPOStats(*(a + b for a, b in zip(totals, stats)))
                self._loss_check.record(totals.loss)
                self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
                grad_norm = self._optimizer_step()
                per_minibatch.append(totals)
        return PPOStats(*map(torch.stack, zip(*per_minibatch))), grad_norm

    def train(self) -> None:
        """Runs the PPO steps: generate, score, estimate advantages, optimise, log and save."""
        throughput = training.ThroughputTracker()
        self._optimizer.zero_grad(set_to_none=True)
        self._profiler.start()
        for epoch in range(self.epochs_run, self._total_epochs):
            self._sampler.set_epoch(epoch)  # on resume the sampler skips what the first run consumed
            steps_done = self.global_step - epoch * self._steps_per_epoch
            steps_in_epoch = min(self._steps_per_epoch, self._total_steps - epoch * self._steps_per_epoch)
            pbar = training.get_progress_bar(steps_in_epoch, epoch, initial=steps_done)
            batches = iter(self._dataloader)
            for _ in range(steps_done, steps_in_epoch):
                input_ids = next(batches)["tokens"].to(self._device)
                context_length = input_ids.shape[1]
                start = time.perf_counter()
                trajectory = self.generate_trajectory_batched(input_ids)
                trajectory_time = time.perf_counter() - start
                rewards, kl, kl_rewards = rlhf.get_rewards_ppo(
                    trajectory.scores,
                    trajectory.logprobs,
                    trajectory.ref_logprobs,
                    self._kl_coeff,
                    trajectory.value_seq_idxs,
                )
                response_mask = ~trajectory.response_padding_masks
                if self._whiten_rewards:
                    rewards = rlhf.whiten(rewards, mask=response_mask, shift_mean=False).masked_fill(~response_mask, 0)
                advantages, returns = rlhf.estimate_advantages(
                    trajectory.values, rewards, self._gamma, self._lmbda, masks=response_mask
                )
                start = time.perf_counter()
                stats, grad_norm = self._ppo_updates(trajectory, advantages, returns, context_length)
                ppo_time = time.perf_counter() - start
                num_tokens = training.count_tokens(input_ids, self._tokenizer.pad_id) + response_mask.sum()
                throughput.update(num_tokens)
                self.global_step += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    self.log_metrics(
                        trajectory, stats, kl, kl_rewards, grad_norm, throughput, num_tokens, trajectory_time, ppo_time
                    )
                    pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {stats.loss.mean().item():.4f}")
                end_of_epoch = self.global_step == epoch * self._steps_per_epoch + steps_in_epoch
                if end_of_epoch:
                    self.epochs_run = epoch + 1
                if end_of_epoch or (self._save_every_n_steps and self.global_step % self._save_every_n_steps == 0):
                    self.save_checkpoint(epoch)
                    throughput.reset()
                self._profiler.step()
            pbar.close()
        self._profiler.stop()

    def _optimizer_step(self) -> torch.Tensor | None:
        grad_norm = None
        if not self._optimizer_in_bwd:  # with optimizer_in_bwd the gradients are already applied and freed
            grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in chain(self._policy_model.parameters(), self._value_model.parameters()) if p.requires_grad]

    def log_metrics(
        self,
        trajectory: Trajectory,
        stats: PPOStats,
        kl: torch.Tensor,
        kl_rewards: torch.Tensor,
        grad_norm: torch.Tensor | None,
        throughput: training.ThroughputTracker,
        num_tokens: torch.Tensor,
        trajectory_time: float,
        ppo_time: float,
    ) -> None:
        """Logs the step's metrics under torchtune's names (reads tensors: the loop's one host-device sync)."""
        metrics = {
            "scores": trajectory.scores.mean(),
            "num_stop_tokens": torch.isin(trajectory.query_responses, self._stop_token_ids).any(dim=-1).sum(),
            "rlhf_reward": trajectory.scores.mean() + kl_rewards.sum(dim=1).mean(),
            "kl": kl.sum(dim=1).mean(),
            "kl_reward": kl_rewards.sum(dim=1).mean(),
            "policy_loss": stats.policy_loss.mean(),
            "value_loss": stats.value_loss.mean(),
            "clipfrac": stats.clipfrac.mean(),
            "ratios": stats.ratios.mean(),
            "approx_policy_kl": stats.approx_policy_kls.mean(),
            "response_lengths": trajectory.seq_lens.float().mean(),
            "tokens_per_second_per_gpu_trajectory": num_tokens / trajectory_time,
            "tokens_per_second_per_gpu_ppo": num_tokens / ppo_time,
        }
        values = training.step_metrics(
            loss=stats.loss.mean().item(),
            optimizer=self._optimizer,
            tokens_per_second=throughput.compute()["tokens_per_second"],
            grad_norm=grad_norm,
            extra=(metrics,),
            memory_device=self._device if self._log_peak_memory_stats else None,
        )
        self._metric_logger.log_dict(values, step=self.global_step)

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


def _check_ppo_config(cfg: DictConfig) -> None:
    """The batch sizes and sampling settings PPO needs, all problems at once."""
    problems = []
    sizes = {k: cfg.get(k) for k in ("batch_size", "forward_batch_size", "ppo_batch_size", "ppo_epochs", "num_steps")}
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(config.ConfigProblem(key, "must be an integer >= 1", value))
    if not problems:
        for key in ("forward_batch_size", "ppo_batch_size"):
            if sizes["batch_size"] % sizes[key]:
                problems.append(
                    config.ConfigProblem(key, f"must divide batch_size ({sizes['batch_size']})", sizes[key])
                )
        if sizes["ppo_batch_size"] % cfg.gradient_accumulation_steps:
            problems.append(
                config.ConfigProblem(
                    "gradient_accumulation_steps",
                    f"must divide ppo_batch_size ({sizes['ppo_batch_size']})",
                    cfg.gradient_accumulation_steps,
                )
            )
        if sizes["num_steps"] < sizes["batch_size"]:
            problems.append(
                config.ConfigProblem(
                    "num_steps",
                    f"counts trajectories: at least batch_size ({sizes['batch_size']}) for one PPO step",
                    sizes["num_steps"],
                )
            )
    temperature = cfg.get("temperature")
    if not isinstance(temperature, int | float) or temperature <= 0:
        problems.append(
            config.ConfigProblem("temperature", "must be > 0 (log-probabilities divide by it)", temperature)
        )
    if problems:
        raise config.ConfigError(problems)


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run ppo_full_finetune_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="PPOFullFinetuneRecipeSingleDevice", cfg=cfg)
    recipe = PPOFullFinetuneRecipeSingleDevice(cfg)
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
