"""padding_free_collate against the padded batch it replaces: same loss, same gradients, same token counts."""

import pytest
import torch
import torch.nn.functional as F

from tune.data import CROSS_ENTROPY_IGNORE_IDX, padded_collate_sft, padding_free_collate
from tune.modules.loss import shift_labels
from tune.training import num_loss_tokens

VOCAB = 64


def _samples(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for n in lengths:
        tokens = torch.randint(1, VOCAB, (n,), generator=gen)
        labels = tokens.clone()
        labels[: n // 3] = CROSS_ENTROPY_IGNORE_IDX  # a masked prompt
        samples.append({"tokens": tokens.tolist(), "labels": labels.tolist()})
    return samples


def _model():
    from tune.models.llama3 import llama3

    torch.manual_seed(0)
    return llama3(vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=128,
                  intermediate_dim=64)


def _loss_and_grads(model, batch):
    model.zero_grad()
    logits = model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
    labels = shift_labels(batch["labels"])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


# [5, 9, 3]: short samples, attention uses the dense block-causal mask; [20, 35, 17]: long enough on average for
# MultiHeadAttention to attend one document at a time (is_causal per sample)
@pytest.mark.parametrize("lengths", [[5, 9, 3], [20, 35, 17]])
def test_padding_free_batch_gives_the_padded_batch_loss_and_gradients(lengths):
    samples, model = _samples(lengths), _model()
    padded = padded_collate_sft(samples)
    flat = padding_free_collate(samples)
    assert flat["tokens"].shape == (1, sum(lengths)) and flat["mask"].shape == (1, sum(lengths), sum(lengths))
    assert flat["input_pos"][0].tolist() == [i for n in lengths for i in range(n)]
    assert num_loss_tokens(shift_labels(flat["labels"])) == num_loss_tokens(shift_labels(padded["labels"]))
    want_loss, want_grads = _loss_and_grads(model, padded)
    got_loss, got_grads = _loss_and_grads(model, flat)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padding_free_falls_back_to_padding_beyond_max_seq_len():
    samples = _samples([5, 9, 3])
    out = padding_free_collate(samples, padding_idx=0, max_seq_len=16)  # 17 tokens do not fit one row of 16
    want = padded_collate_sft(samples, padding_idx=0)
    assert set(out) == {"tokens", "labels"}
    assert torch.equal(out["tokens"], want["tokens"]) and torch.equal(out["labels"], want["labels"])
    assert padding_free_collate(samples, max_seq_len=17)["tokens"].shape == (1, 17)


def test_padding_free_rejects_bad_samples():
    with pytest.raises(ValueError, match="empty batch"):
        padding_free_collate([])
    with pytest.raises(ValueError, match="Sample 1"):
        padding_free_collate([{"tokens": [1, 2], "labels": [1, 2]}, {"tokens": [1, 2, 3], "labels": [1, 2]}])
