"""tune/training/_recipe_state.py: steps per epoch, the progress saved in recipe_state.pt and its restore, the loss
fitted to the model, activation offloading, the validation loss and the metrics of a logging step."""

import contextlib
import io
import logging
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.models.llama3_2 import llama3_2
from tune.modules.loss import CEWithChunkedOutputLoss, LinearCrossEntropyLoss
from tune.training import (
    FinetuningSchedule,
    OffloadActivations,
    activation_offloading_context,
    prepare_loss,
    progress_state,
    restore_progress,
    step_metrics,
    steps_per_epoch,
    validation_loss,
)
from tune.training.checkpointing import StatefulDistributedSampler
from tune.utils import TuneError

IGNORE = -100
TINY = dict(vocab_size=32, num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=16,
            intermediate_dim=32)  # fmt: skip


def _shift(labels: torch.Tensor) -> torch.Tensor:
    """Labels one position to the left, IGNORE in the last column (written out, not tune's shift_labels)."""
    return torch.cat([labels[:, 1:], torch.full((labels.shape[0], 1), IGNORE)], dim=1)


# ------------------------------------------------------------------------------------------ steps_per_epoch


@pytest.mark.parametrize(
    "num_batches, accumulation, cap, expected",
    [
        (10, 1, None, 10),
        (10, 3, None, 3),  # the ragged group of 1 batch makes no step
        (10, 2, 4, 4),  # capped
        (10, 2, 100, 5),  # a cap above the data changes nothing
        (3, 3, None, 1),
    ],
)
def test_steps_per_epoch(num_batches, accumulation, cap, expected):
    assert steps_per_epoch(num_batches, accumulation, cap) == expected


def test_too_little_data_on_one_device():
    with pytest.raises(ValueError) as info:
        steps_per_epoch(2, 3, None)
    assert str(info.value) == (
        "the dataset gives 2 full batches, fewer than gradient_accumulation_steps=3: not one optimizer step per "
        "epoch. Lower batch_size or gradient_accumulation_steps, or use more data"
    )


def test_too_little_data_on_several_ranks():
    with pytest.raises(ValueError) as info:
        steps_per_epoch(2, 3, 10, num_ranks=4)
    assert str(info.value) == (
        "each of the 4 data-parallel ranks gets 2 full batches, fewer than gradient_accumulation_steps=3: not one "
        "optimizer step per epoch. Lower batch_size or gradient_accumulation_steps, use fewer processes, or use "
        "more data"
    )


def test_a_cap_of_zero_steps_is_named_in_the_error():
    # 10 batches fill 10 steps: the data is not what prevents a step, max_steps_per_epoch=0 is
    with pytest.raises(ValueError, match="max_steps_per_epoch"):
        steps_per_epoch(10, 1, 0)


# ------------------------------------------------------------------------------- progress_state / restore

DATASET_SIZE, BATCH_SIZE, SEED, MAX_STEPS = 12, 2, 7, 2
PHASES = [{"params": ["second"], "transition": {"after_steps": 2}}, {"params": ["first"]}]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


class _RecordingSampler(StatefulDistributedSampler):
    """Records when its state is loaded, and draws random numbers there as a real setup step might."""

    def __init__(self, *args, events: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.events = events

    def load_state_dict(self, state):
        self.events.append("sampler")
        _draw_random_numbers()
        super().load_state_dict(state)


class _RecordingSchedule(FinetuningSchedule):
    def __init__(self, *args, events: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.events = events

    def load_state_dict(self, state):
        self.events.append("finetuning_schedule")
        return super().load_state_dict(state)


def _draw_random_numbers() -> tuple[list[float], float, list[float]]:
    return torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist()


class _Run:
    """The pieces of one training run that recipe_state.pt describes, built as a recipe builds them."""

    def __init__(self, events: list[str] | None = None, *, sampler_seed: int = SEED, dataset_size: int = DATASET_SIZE):
        self.events = [] if events is None else events
        torch.manual_seed(0)  # the same initial weights for every run (and RNG state moved, as setup moves it)
        self.model = _Net()
        self.data = torch.randn(DATASET_SIZE, 4, generator=torch.Generator().manual_seed(1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.schedule = _RecordingSchedule(PHASES, events=self.events)
        self.schedule.setup(self.model, self.optimizer, self.scheduler)
        self.sampler = _RecordingSampler(
            range(dataset_size), num_replicas=1, rank=0, shuffle=True, seed=sampler_seed, events=self.events
        )

    def train(self, num_steps: int) -> tuple[int, int, int]:
        """Trains ``num_steps`` optimizer steps of MAX_STEPS per epoch; returns (epochs_run, global_step, epoch)."""
        global_step, epoch = 0, 0
        while True:
            self.sampler.set_epoch(epoch)
            indices = iter(self.sampler)
            for _ in range(MAX_STEPS):
                batch = [next(indices) for _ in range(BATCH_SIZE)]
                self.model(self.data[batch]).pow(2).sum().backward()
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                global_step += 1
                self.schedule.step(global_step, epoch)
                if global_step == num_steps:
                    return (epoch + 1 if global_step % MAX_STEPS == 0 else epoch), global_step, epoch
            epoch += 1

    def state(self, epochs_run: int, global_step: int, epoch: int) -> dict:
        state = progress_state(
            seed=SEED,
            epochs_run=epochs_run,
            total_epochs=3,
            max_steps_per_epoch=MAX_STEPS,
            global_step=global_step,
            steps_in_epoch=global_step - epoch * MAX_STEPS,
            samples_per_step=BATCH_SIZE,
            sampler=self.sampler,
            lr_scheduler=self.scheduler,
            finetuning_schedule=self.schedule,
        )
        state["model"] = self.model.state_dict()  # saved beside the progress by the checkpointer
        state["optimizer"] = self.optimizer.state_dict()
        return state

    def restore(self, state: dict, *, seed: int | None = SEED, max_steps: int = MAX_STEPS, logger=None) -> tuple:
        def load_optimizer() -> None:
            self.events.append("optimizer")
            _draw_random_numbers()  # e.g. a recipe that builds something here
            self.optimizer.load_state_dict(state["optimizer"])

        kwargs = {"logger": logger} if logger is not None else {}
        return restore_progress(
            state,
            seed=seed,
            max_steps_per_epoch=max_steps,
            sampler=self.sampler,
            load_optimizer=load_optimizer,
            lr_scheduler=self.scheduler,
            finetuning_schedule=self.schedule,
            **kwargs,
        )


def _saved(state: dict) -> dict:
    """``state`` written to and read back from a file, as recipe_state.pt is (tensors and plain values only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _uninterrupted_indices(epoch: int) -> list[int]:
    sampler = StatefulDistributedSampler(range(DATASET_SIZE), num_replicas=1, rank=0, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_progress_state_layout():
    run = _Run()
    epochs_run, global_step, epoch = run.train(3)
    assert (epochs_run, global_step, epoch) == (1, 3, 1)  # 2 steps in epoch 0, 1 step into epoch 1
    state = run.state(epochs_run, global_step, epoch)
    assert (state["seed"], state["epochs_run"], state["total_epochs"]) == (SEED, 1, 3)
    assert (state["max_steps_per_epoch"], state["steps_run"]) == (MAX_STEPS, 3)
    assert state["dataloader"]["epoch"] == 1 and state["dataloader"]["num_consumed"] == BATCH_SIZE
    assert state["lr_scheduler"] == run.scheduler.state_dict()
    assert state["finetuning_schedule"]["phase"] == 1
    assert set(state["rng_state"]) >= {"python", "numpy", "torch"}


def test_restore_puts_the_run_back_where_it_stopped():
    run = _Run()
    epochs_run, global_step, epoch = run.train(3)
    state = _saved(run.state(epochs_run, global_step, epoch))
    expected_random = _draw_random_numbers()  # what the uninterrupted run draws next

    events: list[str] = []
    resumed = _Run(events)
    assert len(resumed.optimizer.param_groups) == 1  # phase 0 of a fresh run
    assert resumed.restore(state) == (1, 3, SEED)

    assert _draw_random_numbers() == expected_random  # the RNG states came back last
    assert events == ["finetuning_schedule", "optimizer", "sampler"]
    assert resumed.schedule.current_phase == 1 and len(resumed.optimizer.param_groups) == 2
    assert resumed.scheduler.state_dict() == run.scheduler.state_dict()
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [g["lr"] for g in run.optimizer.param_groups]
    momentum = [resumed.optimizer.state[p]["momentum_buffer"] for p in resumed.model.second.parameters()]
    assert all(torch.equal(a, run.optimizer.state[p]["momentum_buffer"]) for a, p in
               zip(momentum, run.model.second.parameters()))  # fmt: skip
    # the data loader continues epoch 1 after the 2 samples consumed, in the uninterrupted order
    resumed.sampler.set_epoch(epochs_run)
    assert list(resumed.sampler) == _uninterrupted_indices(1)[BATCH_SIZE:]


def test_a_resumed_run_trains_as_the_uninterrupted_one():
    uninterrupted = _Run()
    uninterrupted.train(5)

    first = _Run()
    state = _saved(first.state(*first.train(3)))
    resumed = _Run()
    resumed.model.load_state_dict(state["model"])
    epochs_run, global_step, _ = resumed.restore(state)
    # the rest of epoch 1, then epoch 2, as _Run.train does it
    for epoch in range(epochs_run, 3):
        resumed.sampler.set_epoch(epoch)
        indices = iter(resumed.sampler)
        for _ in range(global_step - epoch * MAX_STEPS, MAX_STEPS):
            batch = [next(indices) for _ in range(BATCH_SIZE)]
            resumed.model(resumed.data[batch]).pow(2).sum().backward()
            resumed.optimizer.step()
            resumed.scheduler.step()
            resumed.optimizer.zero_grad(set_to_none=True)
            global_step += 1
            resumed.schedule.step(global_step, epoch)
            if global_step == 5:
                break
        if global_step == 5:
            break
    for a, b in zip(resumed.model.parameters(), uninterrupted.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_different_cap_is_warned_about(caplog):
    run = _Run()
    state = _saved(run.state(*run.train(3)))
    logger = logging.getLogger("test_recipe_state")
    with caplog.at_level(logging.WARNING, logger="test_recipe_state"):
        _Run().restore(state, max_steps=5, logger=logger)
    assert "max_steps_per_epoch=5 but the checkpoint was written with 2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="test_recipe_state"):
        _Run().restore(state, logger=logger)
    assert caplog.text == ""


def test_a_configured_seed_other_than_the_runs_is_a_tune_error_naming_both():
    run = _Run()
    state = _saved(run.state(*run.train(3)))
    with pytest.raises(TuneError, match=r"^resume_from_checkpoint: the config's seed \(8\) differs .* \(7\).*seed: 7"):
        _Run().restore(state, seed=SEED + 1)


def test_seed_null_resumes_with_the_runs_seed_and_data_order(caplog):
    # the shipped configs say `seed: null`: a resumed process draws another seed, but the run's is in the state
    run = _Run()
    state = _saved(run.state(*run.train(3)))
    resumed = _Run(sampler_seed=12345)  # the sampler built with the new process's drawn seed
    logger = logging.getLogger("test_recipe_state")
    with caplog.at_level(logging.INFO, logger="test_recipe_state"):
        epochs_run, global_step, seed = resumed.restore(state, seed=None, logger=logger)
    assert (global_step, seed) == (3, SEED) and resumed.sampler.seed == SEED
    assert "seed: null: resuming with the run's seed 7" in caplog.text
    uninterrupted = _Run()
    uninterrupted.restore(state)
    assert list(resumed.sampler) == list(uninterrupted.sampler)


def test_a_different_dataset_size_is_a_tune_error():
    run = _Run()
    state = _saved(run.state(*run.train(3)))
    with pytest.raises(TuneError) as info:
        _Run(dataset_size=DATASET_SIZE + 1).restore(state)
    assert str(info.value).startswith("resume_from_checkpoint: ")
    assert "dataset_size: saved 12, now 13" in str(info.value)


def test_without_scheduler_or_schedule():
    sampler = StatefulDistributedSampler(range(8), num_replicas=1, rank=0, shuffle=False)
    state = progress_state(seed=0, epochs_run=0, total_epochs=1, max_steps_per_epoch=None, global_step=2,
                           steps_in_epoch=2, samples_per_step=2, sampler=sampler)  # fmt: skip
    assert state["lr_scheduler"] is None and "finetuning_schedule" not in state
    loaded = []
    restored_sampler = StatefulDistributedSampler(range(8), num_replicas=1, rank=0, shuffle=False)
    result = restore_progress(_saved(state), seed=0, max_steps_per_epoch=None, sampler=restored_sampler,
                              load_optimizer=lambda: loaded.append(True))  # fmt: skip
    assert result == (0, 2, 0) and loaded == [True]
    assert list(restored_sampler) == [4, 5, 6, 7]


# ------------------------------------------------------------------------------------------- prepare_loss


def _tiny_model(tie_word_embeddings: bool) -> nn.Module:
    torch.manual_seed(0)
    return llama3_2(**TINY, tie_word_embeddings=tie_word_embeddings)


def _tokens_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 32, (2, 9), generator=generator)
    labels = tokens.clone()
    labels[0, :3] = IGNORE  # a masked prompt
    labels[1, 6:] = IGNORE  # padding
    return tokens, labels


@pytest.mark.parametrize("tie_word_embeddings", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_chunked_output_loss_runs_as_linear_cross_entropy_with_the_same_value(tie_word_embeddings, reduction):
    model = _tiny_model(tie_word_embeddings)
    tokens, labels = _tokens_and_labels()
    with torch.no_grad():
        logits = model(tokens)  # [b, s, vocab], before the loss takes over the output layer
    reference = F.cross_entropy(logits.reshape(-1, 32), _shift(labels).reshape(-1), ignore_index=IGNORE,
                                reduction=reduction)  # fmt: skip

    loss_fn = prepare_loss(CEWithChunkedOutputLoss(num_output_chunks=4), model, reduction=reduction)
    assert isinstance(loss_fn, LinearCrossEntropyLoss)
    assert (loss_fn.num_output_chunks, loss_fn.ignore_index, loss_fn.reduction) == (4, IGNORE, reduction)
    assert model.skip_output_layer is True
    hidden = model(tokens)
    assert hidden.shape == (2, 9, 16)  # the model now returns hidden states
    torch.testing.assert_close(loss_fn(hidden, _shift(labels)), reference, rtol=1e-5, atol=1e-6)


def test_a_custom_ignore_index_is_kept():
    model = _tiny_model(False)
    tokens, labels = _tokens_and_labels()
    labels[labels == IGNORE] = -1
    with torch.no_grad():
        logits = model(tokens)
    shifted = torch.cat([labels[:, 1:], torch.full((2, 1), -1)], dim=1)
    reference = F.cross_entropy(logits.reshape(-1, 32), shifted.reshape(-1), ignore_index=-1, reduction="sum")
    loss_fn = prepare_loss(CEWithChunkedOutputLoss(num_output_chunks=2, ignore_index=-1), model)
    assert loss_fn.ignore_index == -1
    torch.testing.assert_close(loss_fn(model(tokens), shifted), reference, rtol=1e-5, atol=1e-6)


def test_a_model_without_skip_output_layer_keeps_the_loss():
    model = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 32))
    loss_fn = CEWithChunkedOutputLoss(num_output_chunks=2)
    assert prepare_loss(loss_fn, model) is loss_fn
    assert not hasattr(model, "skip_output_layer")


def test_a_linear_cross_entropy_loss_takes_over_the_output_layer():
    model = _tiny_model(False)
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2)
    assert prepare_loss(loss_fn, model) is loss_fn
    assert model.skip_output_layer is True and loss_fn.linear_projection is model.output


def test_a_plain_sum_loss_on_logits_is_kept_and_the_model_returns_logits():
    model = _tiny_model(False)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    assert prepare_loss(loss_fn, model) is loss_fn
    assert model.skip_output_layer is False


class _TorchtuneMeanLoss(nn.Module):
    """A loss written for torchtune: the mean over scored tokens of [b, s, v] logits, no ``reduction`` declared."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


class _FlatCrossEntropy(nn.CrossEntropyLoss):
    """``nn.CrossEntropyLoss`` on [b, s, v] logits (it wants [b, v, s]), its ``reduction`` kept."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return super().forward(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


@pytest.mark.parametrize(
    "make_loss",
    [_TorchtuneMeanLoss, _FlatCrossEntropy, lambda: _FlatCrossEntropy(reduction="sum")],
    ids=["undeclared-mean", "torch-mean", "torch-sum"],
)
def test_every_loss_gives_the_recipes_the_sum_and_its_gradient(make_loss):
    # the recipes divide what the prepared loss returns by the step's token count: a mean must come back as a
    # sum, or the logged loss and the gradients shrink by the number of tokens (11 here)
    model = _tiny_model(False)
    tokens, labels = _tokens_and_labels()
    reference_model = _tiny_model(False)
    reference = F.cross_entropy(reference_model(tokens).reshape(-1, 32), _shift(labels).reshape(-1),
                                ignore_index=IGNORE, reduction="sum")  # fmt: skip
    reference.backward()

    loss = prepare_loss(make_loss(), model, reduction="sum")(model(tokens), _shift(labels))
    loss.backward()
    assert int((_shift(labels) != IGNORE).sum()) == 11
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-5)
    for (name, param), ref_param in zip(model.named_parameters(), reference_model.parameters()):
        torch.testing.assert_close(param.grad, ref_param.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_mean_is_asked_for_and_a_sum_declared_gives_the_mean():
    model = _tiny_model(False)
    tokens, labels = _tokens_and_labels()
    with torch.no_grad():
        logits = model(tokens)
        loss = prepare_loss(_FlatCrossEntropy(reduction="sum"), model, reduction="mean")(logits, _shift(labels))
    reference = F.cross_entropy(logits.reshape(-1, 32), _shift(labels).reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)


def test_a_loss_with_reduction_none_is_refused_before_training():
    with pytest.raises(ValueError, match="CrossEntropyLoss.reduction is 'none'; a training loss returns one number"):
        prepare_loss(nn.CrossEntropyLoss(reduction="none"), _tiny_model(False))


# --------------------------------------------------------------------------------- activation offloading


def test_activation_offloading_off_is_a_no_op():
    assert isinstance(activation_offloading_context(False, torch.device("cuda")), contextlib.nullcontext)


def test_activation_offloading_on_cpu_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tune"):
        context = activation_offloading_context(True, torch.device("cpu"))
    assert isinstance(context, contextlib.nullcontext)
    assert "enable_activation_offloading=True is ignored: enable_activation_offloading has no effect on CPU" in (
        caplog.text
    )


def test_activation_offloading_on_cuda_offloads():
    # building the context needs no GPU: it only registers the pack/unpack hooks
    assert isinstance(activation_offloading_context(True, torch.device("cuda")), OffloadActivations)


# ---------------------------------------------------------------------------------------- validation_loss


def _val_batches() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    batches = []
    for num_ignored in (0, 5, 2):  # different numbers of loss tokens per batch: a mean of means would differ
        tokens = torch.randint(0, 32, (2, 8), generator=generator)
        labels = tokens.clone()
        labels[0, 8 - num_ignored :] = IGNORE
        batches.append({"tokens": tokens, "labels": labels})
    return batches


def _loss_step(model):
    def loss_step(batch):
        logits = model(batch["tokens"])
        loss = F.cross_entropy(logits.reshape(-1, 32), _shift(batch["labels"]).reshape(-1), ignore_index=IGNORE,
                               reduction="sum")  # fmt: skip
        return loss, {}

    return loss_step


def _reference(model, batches) -> tuple[float, int]:
    """Sum of every batch's summed token loss over the count of labels that are scored after the shift."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["tokens"])[:, :-1]  # the last position predicts nothing
            targets = batch["labels"][:, 1:]
            keep = targets != IGNORE
            total += F.cross_entropy(logits[keep], targets[keep], reduction="sum").item()
            tokens += int(keep.sum())
    return total / tokens, tokens


def test_validation_loss_is_the_token_mean_over_all_batches():
    model = _tiny_model(False)
    batches = _val_batches()
    loss, tokens = validation_loss(_loss_step(model), batches, torch.device("cpu"))
    expected_loss, expected_tokens = _reference(model, batches)
    assert tokens == expected_tokens == 3 * 14 - 5 - 2  # 7 scored labels per row, less the ignored ones
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    mean_of_means = np.mean([_reference(model, [b])[0] for b in batches])
    assert abs(loss - mean_of_means) > 1e-4  # the batches differ enough for the test to tell them apart


def test_validation_loss_reads_at_most_max_steps_batches():
    model = _tiny_model(False)
    batches = _val_batches()
    loss, tokens = validation_loss(_loss_step(model), batches, torch.device("cpu"), max_steps=2)
    expected_loss, expected_tokens = _reference(model, batches[:2])
    assert tokens == expected_tokens and loss == pytest.approx(expected_loss, rel=1e-6)


def test_validation_loss_sums_over_ranks_with_all_reduce():
    model = _tiny_model(False)
    batches = _val_batches()
    other_rank = torch.tensor([30.0, 10.0])  # another rank's summed loss and loss tokens
    calls = []

    def all_reduce(totals: torch.Tensor) -> torch.Tensor:
        calls.append(totals.clone())
        return totals + other_rank

    loss, tokens = validation_loss(_loss_step(model), batches, torch.device("cpu"), all_reduce=all_reduce)
    expected_loss, expected_tokens = _reference(model, batches)
    assert len(calls) == 1
    assert tokens == expected_tokens + 10
    assert loss == pytest.approx((expected_loss * expected_tokens + 30.0) / (expected_tokens + 10), rel=1e-6)


def test_validation_loss_without_loss_tokens_is_zero():
    batch = {"tokens": torch.zeros(1, 4, dtype=torch.long), "labels": torch.full((1, 4), IGNORE)}
    loss, tokens = validation_loss(lambda b: (torch.zeros(()), {}), [batch], torch.device("cpu"))
    assert (loss, tokens) == (0.0, 0)


# ------------------------------------------------------------------------------------------- step_metrics


def test_step_metrics_keys_and_values():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    optimizer.param_groups[0]["lr"] = 0.025  # as a scheduler leaves it
    metrics = step_metrics(
        loss=1.5,
        optimizer=optimizer,
        tokens_per_second=1000.0,
        grad_norm=torch.tensor(2.5),
        extra=[{"num_tokens": torch.tensor(12), "aux": 0.5}, {"kl": torch.tensor(0.25)}],
    )
    assert metrics == {"loss": 1.5, "lr": 0.025, "tokens_per_second": 1000.0, "grad_norm": 2.5, "num_tokens": 12,
                       "aux": 0.5, "kl": 0.25}  # fmt: skip
    assert type(metrics["grad_norm"]) is float and type(metrics["kl"]) is float and type(metrics["num_tokens"]) is int


def test_step_metrics_without_grad_norm_and_with_memory():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    metrics = step_metrics(loss=1.0, optimizer=optimizer, tokens_per_second=10.0)
    assert sorted(metrics) == ["loss", "lr", "tokens_per_second"]  # grad_norm None: optimizer_in_bwd
    metrics = step_metrics(loss=1.0, optimizer=optimizer, tokens_per_second=10.0, memory_device=torch.device("cpu"))
    assert sorted(metrics) == ["loss", "lr", "memory_rss", "peak_memory_rss", "tokens_per_second"]
    assert 0 < metrics["memory_rss"] <= metrics["peak_memory_rss"]


def test_an_optimizer_state_of_another_run_is_a_tune_error_naming_the_fix():
    # e.g. a LoRA run's recipe_state.pt resumed by the full recipe: the optimizer's param groups differ
    run = _Run()
    state = _saved(run.state(*run.train(3)))
    state["optimizer"]["param_groups"][0]["params"] = [0, 1, 2, 3, 4, 5]
    with pytest.raises(
        TuneError, match=r"^resume_from_checkpoint: the saved optimizer .* resume_from_checkpoint: False"
    ):
        _Run().restore(state)
