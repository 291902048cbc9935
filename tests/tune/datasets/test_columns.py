"""The tokenised columns a dataset stores, built from flat buffers (tune.datasets._hf.token_columns): the same
tokens, labels and truncation as the one-sample rule (_hf.truncate)."""

import random

import pytest

from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.data._tokenizers._utils import FlatEncoding
from tune.datasets import _hf

EOS = 2


def _samples(seed: int) -> list[tuple[list[int], list[bool]]]:
    rng = random.Random(seed)
    samples = []
    for _ in range(200):
        length = rng.choice([1, 2, 7, 15, 16, 17, 30])
        tokens = [rng.randrange(3, 50) for _ in range(length)]
        if rng.random() < 0.5:
            tokens[-1] = EOS
        samples.append((tokens, [rng.random() < 0.5 for _ in range(length)]))  # mask: True = no loss
    return samples


def _expected(samples, max_seq_len):
    rows = []
    for tokens, mask in samples:
        tokens, mask, cut = _hf.truncate(list(tokens), list(mask), max_seq_len, EOS)
        labels = [CROSS_ENTROPY_IGNORE_IDX if m else t for t, m in zip(tokens, mask)]
        rows.append((tokens, labels, cut))
    return rows


@pytest.mark.parametrize("max_seq_len", [None, 16, 1])
def test_columns_equal_the_one_sample_rule(max_seq_len):
    samples = _samples(seed=0)
    expected = _expected(samples, max_seq_len)
    flat = FlatEncoding.join([(tokens, [not m for m in mask]) for tokens, mask in samples])
    tokens, labels, cuts = _hf.token_columns(flat, max_seq_len, EOS)
    assert list(zip(tokens.to_pylist(), labels.to_pylist(), cuts.to_pylist())) == expected
    assert any(cut for _, _, cut in expected) == (max_seq_len is not None)
    # the flat buffers are left as they were (the columns own copies)
    assert FlatEncoding.join([(t, [not m for m in mask]) for t, mask in samples]) == flat
