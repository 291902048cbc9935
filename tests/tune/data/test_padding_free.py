"""padding_free_collate against the padded batch it replaces: same loss, same gradients, same token counts."""

import pytest
import torch
import torch.nn.functional as F

from tune.data import CROSS_ENTROPY_IGNORE_IDX, padded_collate_packed, padded_collate_sft, padding_free_collate
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
    return llama3(
        vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=256, intermediate_dim=64
    )


def _loss_and_grads(model, batch):
    model.zero_grad()
    logits = model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
    labels = shift_labels(batch["labels"])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _assert_same_training_signal(model, flat, padded, lengths):
    """The padding-free row holds the documents end to end and gives the padded batch's loss and gradients."""
    total = sum(lengths)
    assert flat["tokens"].shape == (1, total) and flat["mask"].shape == (1, total, total)
    assert flat["input_pos"][0].tolist() == [i for n in lengths for i in range(n)]
    assert num_loss_tokens(shift_labels(flat["labels"])) == num_loss_tokens(shift_labels(padded["labels"]))
    want_loss, want_grads = _loss_and_grads(model, padded)
    got_loss, got_grads = _loss_and_grads(model, flat)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# [5, 9, 3]: short samples, attention uses the dense block-causal mask; [20, 35, 17]: long enough on average for
# MultiHeadAttention to attend one document at a time (is_causal per sample)
@pytest.mark.parametrize("lengths", [[5, 9, 3], [20, 35, 17]])
def test_padding_free_batch_gives_the_padded_batch_loss_and_gradients(lengths):
    samples, model = _samples(lengths), _model()
    padded = padded_collate_sft(samples)
    flat = padding_free_collate(samples)
    _assert_same_training_signal(model, flat, padded, lengths)


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


def _packs(lengths, max_seq_len):
    from tune.data import PackedDataset

    packed = PackedDataset(_samples(lengths, seed=1), max_seq_len=max_seq_len)
    return [packed[i] for i in range(len(packed))]


# documents of 20..35 tokens in packs of 64: each pack ends in 5..29 positions of padding
def test_padding_free_packs_give_the_padded_packs_loss_and_gradients():
    packs, model = _packs([20, 35, 17, 30, 25, 22], max_seq_len=64), _model()
    assert len(packs) == 3 and all(int(p["seq_lens"][-1]) > 0 and p["labels"][-1] == -100 for p in packs)
    padded = padded_collate_packed(packs)
    flat = padding_free_collate(packs)
    assert flat["tokens"].shape == (1, 149)  # 20 + 35 + ... + 22: the packs' padding is gone
    _assert_same_training_signal(model, flat, padded, [20, 35, 17, 30, 25, 22])


def test_padding_free_packs_fall_back_to_padded_packs():
    packs = _packs([20, 35, 17, 30], max_seq_len=64)  # 102 real tokens in 2 packs of 64
    assert padding_free_collate(packs, max_seq_len=102)["tokens"].shape == (1, 102)
    out = padding_free_collate(packs, max_seq_len=101)
    want = padded_collate_packed(packs)
    assert out.keys() == want.keys() and all(torch.equal(out[k], want[k]) for k in want)
    # a batch with nothing to train on stays as it is rather than becoming an empty row
    for p in packs:
        p["labels"][:] = CROSS_ENTROPY_IGNORE_IDX
    assert padding_free_collate(packs)["tokens"].shape == (2, 64)
