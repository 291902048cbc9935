"""LoRA Direct Preference Optimization (DPO) of a language model on one device (CPU, one GPU or Apple MPS).

Trains LoRA adapters on preference pairs (a prompt, a chosen and a rejected completion) with a preference loss from
``tune.rlhf.loss``: DPO (``loss_type`` sigmoid, hinge, IPO or robust), RSO, or the reference-free SimPO and ORPO. The
reference model is the policy with its adapters disabled (``tune.modules.peft.disable_adapter``): no second copy of the
weights; with ``precompute_ref_log_probs: true`` its log-probs of every training pair are computed once, before
training, and looked up at each step. Sequence log-probabilities are sums over the completion tokens (means for IPO,
SimPO and ORPO; the model returns hidden states and only the completion positions are projected onto the vocabulary,
``tune.rlhf.model_sequence_log_probs``), from batches laid out chosen sequences first, then rejected ones: on CPU
in one row without padding (``tune.data.padding_free_collate_dpo``, the default there), elsewhere padded
(``tune.data.padded_collate_dpo``); packing is not supported. The loss of a step is the mean over all of its pairs
(every micro-batch), and the metrics carry TRL's names (``rewards/chosen``, ``rewards/accuracies``, ``logps/chosen``,
``logits/chosen``, ...) averaged over the same pairs. ORPO (``tune.rlhf.loss.ORPOLoss``, ``chosen_nll``) adds the
negative log-likelihood of the chosen sequences (prompt and completion, every token), averaged over every chosen token
of the step, and logs ``nll_loss``, ``log_odds_ratio`` and ``log_odds_chosen`` as TRL's ORPO trainer does. Outputs are
those of ``lora_finetune_single_device``: the adapter in the Hugging Face PEFT format and the merged model.

The file reads top to bottom: ``__init__`` reads and checks the config, ``setup`` builds the pieces, ``train``
holds the loop, ``loss_step`` computes the loss of one micro-batch of pairs, ``save_checkpoint`` writes
``output_dir/step_N/``.

    tune run lora_dpo_single_device --config llama3_1/8B_lora_dpo_single_device
    tune cp lora_dpo_single_device my_recipe.py   # then: tune run my_recipe.py --config my.yaml
"""

import sys
from functools import partial
from typing import Any

import torch
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
    "supports_distributed": False,
    "configs": [
        "*/*_lora_dpo_single_device",
        "*/*_qlora_dpo_single_device",
        "*/*_lora_orpo_single_device",
        "*/*_qlora_orpo_single_device",
    ],
    # the optional keys this recipe reads: filled in from tune.config.OPTIONAL_KEYS where a config leaves them out
    "optional_keys": ["finetune", "lora", "dpo"],
}

# settings of the "finetune" table this recipe does not support, with the reason (reported with the other problems)
UNSUPPORTED = {
    "dataset.packed": "a chosen and a rejected sequence form one sample; preference pairs are not packed",
    "model_converters": "build the model with a lora_* builder instead",
    "finetuning_schedule": "gradual unfreezing is offered by the SFT recipes only",
}

log = utils.get_logger(name="tune.recipes.lora_dpo_single_device")


class LoRADPORecipeSingleDevice:
    """LoRA/QLoRA/DoRA preference optimization on one device; implements
    :class:`tune.recipe_interfaces.FTRecipeInterface`.

    Supports gradient accumulation (the loss is the mean over all pairs of the step), gradient clipping, any
    optimizer and LR scheduler by ``_component_``, ``optimizer_in_bwd``, activation checkpointing and offloading,
    ``compile``, fp32/bf16, validation every N steps (loss and reward metrics on held-out pairs), step and epoch
    checkpoints with exact mid-epoch resume, metric loggers, a progress bar and the profiler.

    Args:
        cfg (DictConfig): the recipe config (see ``configs/*/*_lora_dpo_single_device.yaml``).

    Raises:
        tune.config.ConfigError: listing every inconsistent setting of the config at once.
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_training_config(cfg, unsupported=UNSUPPORTED)  # every problem at once, before anything is built
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, device=self._device)
        if self._device.type == "cpu" and training.configure_cpu_allocator():
            log.info("CPU: malloc keeps freed blocks for the next step (TUNE_CPU_ALLOCATOR=0 turns this off).")
        self._output_dir = cfg.output_dir
        self._resume = cfg.resume_from_checkpoint
        self._log_every_n_steps = cfg.log_every_n_steps
        self._log_peak_memory_stats = cfg.log_peak_memory_stats
        self._clip_grad_norm = cfg.clip_grad_norm
        self._compile = cfg.compile
        self._optimizer_in_bwd = cfg.optimizer_in_bwd
        self._enable_activation_checkpointing = cfg.enable_activation_checkpointing
        self._enable_activation_offloading = cfg.enable_activation_offloading
        self._save_every_n_steps = cfg.save_every_n_steps
        self._run_val_every_n_steps = cfg.run_val_every_n_steps
        self._max_validation_steps = cfg.max_validation_steps
        self._epochs = cfg.epochs
        self._max_steps_per_epoch = cfg.max_steps_per_epoch
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self._precompute_reference = cfg.precompute_ref_log_probs
        self._seed = training.set_seed(cfg.seed)
        self.epochs_run = 0  # completed epochs
        self.global_step = 0  # optimizer steps taken
        self._loss_since_log = torch.zeros((), dtype=torch.float32, device=self._device)  # summed step losses
        self._loss_check = training.FiniteLossCheck(self._device)
        self._metrics = rlhf.PreferenceMetrics(self._device)  # rewards, log-probs and logits since the last log

    # ------------------------------------------------------------------------------------------------ checkpoint

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Builds the checkpointer and reads the model weights (and the training state when resuming).

        Args:
            cfg_checkpointer (DictConfig): the ``checkpointer`` section.

        Returns:
            dict[str, Any]: the model state under ``training.MODEL_KEY``; when resuming also the adapter, optimizer,
            LR scheduler, progress, data-loader position and RNG states (see ``tune.training.checkpointing``).
        """
        self._checkpointer = config.instantiate_checkpointer(
            cfg_checkpointer, resume_from_checkpoint=self._resume, keep_last_n_checkpoints=self._keep_last_n_checkpoints
        )
        return self._checkpointer.load_checkpoint()

    def save_checkpoint(self, epoch: int) -> None:
        """Writes ``output_dir/step_N/`` atomically: the adapter in the PEFT format, the merged model in its input
        format (unless ``save_adapter_weights_only``), the config and, unless this is the last step of the run,
        ``recipe_state.pt`` to resume from.

        Args:
            epoch (int): the epoch being trained (0-based); used for the data-loader position.
        """
        self._recipe_state.save(epoch=epoch, epochs_run=self.epochs_run, global_step=self.global_step, config=self._cfg)

    # ---------------------------------------------------------------------------------------------------- setup

    def setup(self, cfg: DictConfig) -> None:
        """Builds the metric logger, model, tokenizer, optimizer, loss, data, LR scheduler and profiler."""
        self._cfg = cfg
        self._keep_last_n_checkpoints = cfg.keep_last_n_checkpoints
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._metric_logger.log_config(cfg)
        ckpt = self.load_checkpoint(cfg.checkpointer)
        self._model = self._setup_model(cfg.model, ckpt[training.MODEL_KEY], ckpt.get(training.ADAPTER_KEY))
        self._tokenizer = config.instantiate(cfg.tokenizer)
        # counts each step's loss tokens: an epoch without any is an error, not a saved untrained model
        self._loss_tokens = training.LossTokenCounter(max_seq_len=getattr(self._tokenizer, "max_seq_len", None))
        self._optimizer = self._setup_optimizer(cfg.optimizer)
        self._loss_fn = config.instantiate(cfg.loss)
        # what the loss needs (tune.rlhf.loss): mean instead of summed log-probs, and whether a reference is used
        self._average_log_probs = getattr(self._loss_fn, "average_log_probs", False)
        self._reference_free = getattr(self._loss_fn, "reference_free", False)
        # ORPO: the loss asks for the chosen sequences' NLL (added here) and reports its log odds ratio
        self._chosen_nll = getattr(self._loss_fn, "chosen_nll", False)
        self._log_odds = getattr(self._loss_fn, "log_odds", None)
        log.info("Loss: %s (%s).", config.component_name(cfg.loss), self._describe_loss())
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, cfg.batch_size, cfg.collate_fn)
        # the reference's log-probs of every training pair, by dataset index (None: computed at every step)
        self._reference_table = None
        if self._precompute_reference and self._reference_free:
            log.warning(
                "precompute_ref_log_probs has no effect: %s needs no reference model.", config.component_name(cfg.loss)
            )
        elif self._precompute_reference:
            pairs = self._dataloader.dataset.dataset  # IndexedPairs around the pairs
            with disable_adapter(self._model):  # the reference: the policy with its adapters disabled
                self._reference_table = rlhf.precompute_reference_log_probs(
                    self._model,
                    pairs,
                    self._collate,
                    batch_size=cfg.batch_size,
                    device=self._device,
                    average_log_probs=self._average_log_probs,
                )
            log.info("Reference log-probabilities of %d training pairs computed once.", len(pairs))
        self._val_dataloader = None
        if cfg.dataset_val is not None:
            _, self._val_dataloader = self._setup_data(
                cfg.dataset_val, False, cfg.batch_size, cfg.collate_fn, drop_last=False
            )
        with config.errors_at("batch_size", cfg.batch_size):
            self._steps_per_epoch = training.steps_per_epoch(
                len(self._dataloader), self._gradient_accumulation_steps, self._max_steps_per_epoch
            )
        self._total_steps = self._epochs * self._steps_per_epoch
        self._lr_scheduler = config.instantiate_lr_scheduler(cfg.lr_scheduler, self._optimizer, self._total_steps)
        self._profiler = training.DummyProfiler()
        if cfg.profiler is not None:
            self._profiler, _ = config.instantiate(cfg.profiler)  # (profiler, the settings it used)
        self._recipe_state = config.recipe_state(  # what a save writes and a resume restores
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
            self.epochs_run, self.global_step, self._seed = self._recipe_state.restore(ckpt, cfg.seed, log)
        config.save_config(cfg, self._output_dir)

    def _describe_loss(self) -> str:
        reference = "no reference model" if self._reference_free else "reference: the model with adapters disabled"
        log_probs = "mean" if self._average_log_probs else "summed"
        nll = "; plus the NLL of the chosen sequences per token" if self._chosen_nll else ""
        return f"{reference}; {log_probs} log-probabilities over the completion tokens{nll}"

    def _setup_model(
        self, cfg_model: DictConfig, base_state_dict: dict[str, Any], adapter_state_dict: dict[str, Any] | None
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        training.load_lora_state_dicts(model, base_state_dict)  # then DoRA magnitudes from the loaded weights
        with config.errors_at("model._component_", cfg_model._component_):  # only the adapters learn
            adapter_params, self._adapter_config = training.prepare_lora_model(model, model_converters=False)
        if adapter_state_dict is not None:  # resuming, or continuing from a saved adapter
            training.load_lora_state_dicts(model, adapter_state_dict=adapter_state_dict)
        # the policy and the reference (the same model, adapters off) must score a sequence the same way
        training.disable_dropout(model)
        if self._enable_activation_checkpointing:
            training.apply_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        if self._compile:
            training.compile_model(model)
        self._activations_ctx = training.activation_offloading_context(self._enable_activation_offloading, self._device)
        num_params = sum(p.numel() for p in model.parameters())
        num_trainable = sum(p.numel() for p in adapter_params.values())
        log.info(
            "Model: %s parameters, %s of them trainable adapter weights, in %s on %s.",
            f"{num_params:,}",
            f"{num_trainable:,}",
            self._dtype,
            self._device,
        )
        return model

    def _setup_optimizer(self, cfg_optimizer: DictConfig) -> torch.optim.Optimizer:
        if self._optimizer_in_bwd:
            # one optimizer per parameter, stepped by a hook as soon as that parameter's gradient is ready
            factory = partial(config.instantiate, cfg_optimizer)
            return training.OptimizerInBackward(self._model.named_parameters(), factory)
        return config.instantiate(cfg_optimizer, self._trainable_params())

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
        # chosen sequences first, then rejected ones: padded rows, or one padding-free row
        self._collate = config.instantiate_collate(
            cfg_collate,
            dataset,
            padding_idx=self._tokenizer.pad_id,
            ignore_idx=CROSS_ENTROPY_IGNORE_IDX,
            max_seq_len=getattr(self._model, "max_seq_len", None),
            device_type=self._device.type,
            pairs=True,
        )
        sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=self._seed)
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
        log.info("Dataset %s: %d pairs, %d batches.", config.component_name(cfg_dataset), len(dataset), len(loader))
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
            of the whole step) and, for a loss with ``chosen_nll`` (ORPO), the SUM of the negative log-likelihood of
            the chosen sequences' tokens (the loop divides by those tokens of the whole step); None otherwise.
        """
        tokens, labels, packed = batch.tokens, batch.labels, batch.packed  # packed: {} for padded rows
        average = self._average_log_probs  # means instead of sums (IPO, SimPO, ORPO)
        # ORPO: every token of the chosen sequences (prompt included) is scored in the same pass, for the NLL
        nll_labels = rlhf.chosen_nll_labels(tokens, labels, seq_lens=batch.seq_lens) if self._chosen_nll else None
        reference = None
        if self._reference_table is not None and indices is not None:
            looked_up = self._reference_table[indices.to(self._device)]  # [b, 2]
            reference = (looked_up[:, 0], looked_up[:, 1])
        elif not self._reference_free:  # the policy with its adapters disabled (its output layer's too)
            with torch.no_grad(), disable_adapter(self._model):
                reference = rlhf.model_sequence_log_probs(
                    self._model, tokens, labels, average_log_probs=average, **packed
                )
                reference = reference.log_probs.chunk(2)
        with self._activations_ctx:  # only the completion positions are projected onto the vocabulary
            scores = rlhf.model_sequence_log_probs(
                self._model, tokens, labels, average_log_probs=average, nll_labels=nll_labels, **packed
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
            pbar = training.get_progress_bar(self._steps_per_epoch, epoch, initial=steps_done)
            batches = iter(self._dataloader)
            for _ in range(steps_done, self._steps_per_epoch):
                micro_batches = [next(batches) for _ in range(self._gradient_accumulation_steps)]
                # every pair of the step weighs the same: the loss is their mean (pairs counted on the CPU batches)
                loss_scale = self._loss_tokens.step_loss_scale(
                    sum(batch.num_pairs for batch, _ in micro_batches),
                    num_loss_tokens=sum(training.num_loss_tokens(batch.labels) for batch, _ in micro_batches),
                )
                if self._chosen_nll:  # ORPO's NLL is a mean over every chosen token of the step (prompts included)
                    nll_labels = [
                        rlhf.chosen_nll_labels(b.tokens, b.labels, seq_lens=b.seq_lens) for b, _ in micro_batches
                    ]
                    nll_scale = training.step_loss_scale(sum(training.num_loss_tokens(n[:, 1:]) for n in nll_labels))
                step_loss = torch.zeros((), dtype=torch.float32, device=device)
                for batch_index, (batch, indices) in enumerate(micro_batches):
                    throughput.update(training.count_tokens(batch.tokens, self._tokenizer.pad_id))
                    batch = batch.to(device, non_blocking=True)
                    # this micro-batch's share of the step's mean
                    pair_loss, nll = self.loss_step(batch, self._metrics, indices)
                    loss = pair_loss * loss_scale
                    if nll is not None:  # ORPO: plus its share of the step's NLL per chosen token
                        loss = loss + nll * nll_scale
                    step_loss += loss.detach()
                    if batch_index == self._gradient_accumulation_steps - 1:  # the step's loss, read once
                        self._loss_check.record(step_loss)  # backward is queued, before the optimizer step
                    loss.backward()
                self._loss_check.check(self.global_step + 1)  # a NaN/inf loss stops the run before it is applied
                grad_norm, optimizer_metrics = self._optimizer_step()
                self.global_step += 1
                self._loss_since_log += step_loss
                steps_since_log += 1
                pbar.update(1)

                if self.global_step % self._log_every_n_steps == 0:
                    metrics = training.step_metrics(  # reads tensors: the loop's one host-device sync
                        loss=self._loss_since_log.item() / steps_since_log,
                        optimizer=self._optimizer,
                        tokens_per_second=throughput.compute()["tokens_per_second"],
                        grad_norm=grad_norm,
                        extra=(self._metrics.compute(), optimizer_metrics),
                        memory_device=self._device if self._log_peak_memory_stats else None,
                    )
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

    def _optimizer_step(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        grad_norm = None
        if not self._optimizer_in_bwd:  # with optimizer_in_bwd the gradients are already applied and freed
            grad_norm = training.clip_grad_norm(self._trainable_params(), self._clip_grad_norm)
        out = self._optimizer.step()  # a user's optimizer may return metrics to log
        self._optimizer.zero_grad(set_to_none=True)
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()
        return grad_norm, out if isinstance(out, dict) else {}

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _validate(self) -> None:
        """The mean loss and the reward metrics over the held-out pairs, logged with a ``val_`` prefix."""
        self._model.eval()
        metrics = rlhf.PreferenceMetrics(self._device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self._device)
        num_pairs = 0
        for index, (batch, _) in enumerate(self._val_dataloader):
            if self._max_validation_steps is not None and index >= self._max_validation_steps:
                break
            loss_sum += self.loss_step(batch.to(self._device), metrics)[0].float()
            num_pairs += batch.num_pairs
        self._model.train()
        values = {"val_loss": loss_sum.item() / max(num_pairs, 1)}
        values.update({f"val_{name}": value for name, value in metrics.compute().items()})
        values["val_loss"] += values.get("val_nll_loss", 0.0)  # ORPO: plus the chosen sequences' NLL per token
        self._metric_logger.log_dict(values, step=self.global_step)
        log.info(
            "Step %d: validation loss %.4f, reward accuracy %.3f over %d pairs.",
            self.global_step,
            values["val_loss"],
            values.get("val_rewards/accuracies", float("nan")),
            num_pairs,
        )

    def cleanup(self) -> None:
        """Closes the metric logger."""
        self._metric_logger.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run lora_dpo_single_device --config CONFIG [key=value ...]``."""
    config.log_config(recipe_name="LoRADPORecipeSingleDevice", cfg=cfg)
    recipe = LoRADPORecipeSingleDevice(cfg)
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
