"""Step-level loss normalisation: gradient accumulation must give the gradient of one big batch."""

import os
import pickle

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tests._helpers import free_port
from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.training import LossTokenCounter, NoLossTokensError, num_loss_tokens, scale_grads, step_loss_scale
from tune.utils import TuneError

IGNORE = -100
VOCAB, DIM = 40, 16


class TinyDecoder(nn.Module):
    """Embedding -> 2 layers -> output, returning hidden states when ``skip_output_layer`` (as tune decoders do)."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(2))
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.skip_output_layer = False

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return h if self.skip_output_layer else self.output(h)


def _batch():
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (4, 12), generator=gen)
    labels = tokens.clone()
    # uneven padding: 12, 9, 4 and 7 real tokens, so the two micro-batches hold different token counts
    for row, length in enumerate([12, 9, 4, 7]):
        labels[row, length:] = IGNORE
    return tokens, labels


def _model_and_loss():
    torch.manual_seed(0)
    model = TinyDecoder()  # fp32, as trained
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=3, reduction="sum")  # summed per micro-batch, then scaled
    loss_fn.set_model_output(model)
    return model, loss_fn


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _one_big_batch():
    model, loss_fn = _model_and_loss()
    tokens, labels = _batch()
    labels = shift_labels(labels)
    # the definition: mean token loss over the whole batch
    (loss_fn(model(tokens), labels) / (labels != IGNORE).sum()).backward()
    return _grads(model)


def _accumulate(counts_first: bool):
    model, loss_fn = _model_and_loss()
    tokens, labels = _batch()
    micro = [(tokens[:2], shift_labels(labels[:2])), (tokens[2:], shift_labels(labels[2:]))]
    if counts_first:
        scale = step_loss_scale(sum(num_loss_tokens(y) for _, y in micro))
        for x, y in micro:
            (loss_fn(model(x), y) * scale).backward()
    else:
        running = torch.zeros((), dtype=torch.int64)
        for x, y in micro:
            loss_fn(model(x), y).backward()
            running += num_loss_tokens(y)
        scale_grads(model, step_loss_scale(running))
    return _grads(model)


@pytest.mark.parametrize("counts_first", [True, False])
def test_gradient_accumulation_2x2_equals_one_batch_of_4(counts_first):
    want, got = _one_big_batch(), _accumulate(counts_first)
    max_error = max((got[name] - want[name]).abs().max().item() for name in want)
    print(f"grad accumulation 2x2 vs 1x4 ({'counts first' if counts_first else 'scale_grads'}): {max_error:.2e}")
    assert max_error < 1e-6


def test_naive_per_micro_batch_mean_differs():
    # control: averaging each micro-batch's own mean (uneven token counts) is NOT the big-batch gradient,
    # so the equality above is a real check
    want = _one_big_batch()
    model, loss_fn = _model_and_loss()
    tokens, labels = _batch()
    for x, y in ((tokens[:2], labels[:2]), (tokens[2:], labels[2:])):
        y = shift_labels(y)
        (loss_fn(model(x), y) / num_loss_tokens(y) / 2).backward()
    max_error = max((p.grad - want[name]).abs().max().item() for name, p in model.named_parameters())
    assert max_error > 1e-4


def test_num_loss_tokens_and_scale_without_a_process_group():
    labels = torch.tensor([[1, 2, IGNORE], [IGNORE, IGNORE, IGNORE]])
    count = num_loss_tokens(labels)
    assert count.dtype == torch.int64 and count.item() == 2
    assert step_loss_scale(count).item() == pytest.approx(0.5)
    # a step with no loss tokens: factor 1 (the summed loss is 0 anyway), never a division by zero
    assert step_loss_scale(torch.tensor(0)).item() == 1.0
    assert step_loss_scale(torch.tensor(4), world_size=2).item() == pytest.approx(0.5)


# ---------------------------------------------------------------------------------- LossTokenCounter: no loss tokens


def test_counter_scale_equals_step_loss_scale():
    counter = LossTokenCounter()
    for count in (7, 0, 123):
        assert counter.step_loss_scale(torch.tensor(count)).item() == step_loss_scale(torch.tensor(count)).item()


def test_an_epoch_without_loss_tokens_is_an_error_naming_max_seq_len_and_the_fix():
    counter = LossTokenCounter(max_seq_len=8)
    for _ in range(3):
        counter.step_loss_scale(torch.tensor(0))
    with pytest.raises(NoLossTokensError) as err:
        counter.check(epoch=0, end_of_epoch=True)
    message = str(err.value)
    assert message.startswith("Epoch 1 (3 steps) has no token to learn from")
    assert "max_seq_len=8" in message and "tokenizer.max_seq_len" in message and "train_on_input" in message
    assert "\n" not in message
    assert isinstance(err.value, TuneError)  # printed as one `error:` line by the recipe entry point


def test_a_step_without_loss_tokens_is_fine_when_the_epoch_has_some():
    counter = LossTokenCounter(max_seq_len=8)
    counter.step_loss_scale(torch.tensor(0))
    counter.step_loss_scale(torch.tensor(5))
    counter.check(epoch=0, end_of_epoch=True)
    # the next epoch is counted afresh: with no token at all it is an error, whatever the first epoch had
    counter.step_loss_scale(torch.tensor(0))
    counter.check(epoch=1, end_of_epoch=False)  # a mid-epoch save: the run has trained, so it may save
    with pytest.raises(NoLossTokensError, match=r"^Epoch 2 \(1 steps\)"):
        counter.check(epoch=1, end_of_epoch=True)


def test_a_save_before_any_loss_token_is_an_error():
    counter = LossTokenCounter()  # no max_seq_len: the message points at the dataset's masking instead
    counter.step_loss_scale(torch.tensor(0))
    counter.step_loss_scale(torch.tensor(0))
    with pytest.raises(NoLossTokensError, match=r"^The run \(2 steps so far\).*train_on_input"):
        counter.check(epoch=0, end_of_epoch=False)
    LossTokenCounter().check(epoch=0, end_of_epoch=True)  # no step yet (a resumed run at its end): nothing to say


def _counter_worker(rank, port, per_rank_tokens, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        outcomes = []
        for tokens in per_rank_tokens:  # one epoch of one step per entry: (rank 0's count, rank 1's count)
            counter = LossTokenCounter(max_seq_len=8)
            scale = counter.step_loss_scale(torch.tensor(tokens[rank]))
            try:
                counter.check(epoch=0, end_of_epoch=True)
                outcomes.append(scale.item())
            except NoLossTokensError:
                outcomes.append("error")
        torch.save(outcomes, f"{result_path}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def test_counts_are_over_all_ranks(tmp_path):
    """A rank without loss tokens trains on while the other rank has some; with none on any rank, both stop."""
    per_rank_tokens = [(6, 0), (0, 0)]
    mp.spawn(_counter_worker, args=(free_port(), per_rank_tokens, str(tmp_path / "out")), nprocs=2)
    for rank in (0, 1):
        assert torch.load(f"{tmp_path / 'out'}.{rank}", weights_only=True) == [pytest.approx(2 / 6), "error"]


def test_a_loss_averaged_over_pairs_counts_its_tokens_apart():
    counter = LossTokenCounter(max_seq_len=8)
    scale = counter.step_loss_scale(4, num_loss_tokens=torch.tensor(0))  # DPO: 4 pairs, every label cut off
    assert scale.item() == 1 / 4  # the loss is still the mean over the pairs
    with pytest.raises(NoLossTokensError, match=r"^Epoch 1 \(1 steps\) has no token to learn from"):
        counter.check(epoch=0, end_of_epoch=True)
    counter = LossTokenCounter(max_seq_len=8)
    counter.step_loss_scale(4, num_loss_tokens=torch.tensor(30))
    counter.check(epoch=0, end_of_epoch=True)


def test_the_error_pickles_unchanged():
    error = NoLossTokensError("Epoch 2 (5 steps)", max_seq_len=16)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NoLossTokensError and str(copy) == str(error) and copy.max_seq_len == 16
