"""Step-level loss normalisation: gradient accumulation must give the gradient of one big batch."""

import pytest
import torch
from torch import nn

from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.training import num_loss_tokens, scale_grads, step_loss_scale

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
