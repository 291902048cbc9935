"""tune/data/_collate.py: padding_free_collate_dpo and PreferenceBatch, against padded_collate_dpo."""

import pytest
import torch

from tune.data import (
    PreferenceBatch,
    block_causal_mask,
    padded_collate_dpo,
    padding_free_collate_dpo,
    preference_batch,
)


def _pairs(with_margin: bool) -> list[dict]:
    # unequal lengths within and across pairs; the prompt is masked (-100)
    lengths = [(5, 3), (2, 6), (4, 4)]
    pairs = []
    for i, (chosen_len, rejected_len) in enumerate(lengths):
        chosen = list(range(10 * i + 1, 10 * i + 1 + chosen_len))
        rejected = list(range(100 + 10 * i, 100 + 10 * i + rejected_len))
        pair = {
            "chosen_input_ids": chosen,
            "chosen_labels": [-100] + chosen[1:],
            "rejected_input_ids": rejected,
            "rejected_labels": [-100] + rejected[1:],
        }
        if with_margin:
            pair["margin"] = 0.5 * i
        pairs.append(pair)
    return pairs


@pytest.mark.parametrize("with_margin", [False, True])
def test_padding_free_row_holds_the_padded_rows(with_margin):
    pairs = _pairs(with_margin)
    packed = padding_free_collate_dpo(pairs, padding_idx=0)
    tokens, labels, *margin = padded_collate_dpo(pairs, padding_idx=0)
    seq_lens = torch.tensor([5, 2, 4, 3, 6, 4])  # chosen sequences first, then rejected, in pair order
    torch.testing.assert_close(packed["seq_lens"], seq_lens)
    assert packed["tokens"].shape == packed["labels"].shape == packed["input_pos"].shape == (1, 24)
    assert packed["mask"].shape == (1, 24, 24)
    torch.testing.assert_close(packed["mask"], block_causal_mask([seq_lens], 24))
    # each padded row's real tokens, in order; positions restart at 0
    unpadded = torch.cat([row[:n] for row, n in zip(tokens, seq_lens)])
    torch.testing.assert_close(packed["tokens"][0], unpadded)
    torch.testing.assert_close(packed["input_pos"][0], torch.cat([torch.arange(n) for n in seq_lens]))
    # labels too, with each sequence's first label ignored (position 0 predicts nothing in the padded rows either)
    expected_labels = torch.cat([row[:n] for row, n in zip(labels, seq_lens)])
    starts = seq_lens.cumsum(0) - seq_lens
    expected_labels[starts] = -100
    torch.testing.assert_close(packed["labels"][0], expected_labels)
    assert ("margin" in packed) == with_margin
    if with_margin:
        torch.testing.assert_close(packed["margin"], margin[0])
        torch.testing.assert_close(packed["margin"], torch.tensor([0.0, 0.5, 1.0]))


@pytest.mark.parametrize("with_margin", [False, True])
def test_preference_batch_reads_both_collators(with_margin):
    pairs = _pairs(with_margin)
    padded = preference_batch(padded_collate_dpo(pairs))
    packed = preference_batch(padding_free_collate_dpo(pairs))
    assert padded.num_pairs == packed.num_pairs == 3
    assert padded.packed == {}
    assert set(packed.packed) == {"seq_lens", "input_pos", "mask"}
    assert (padded.margin is None) == (packed.margin is None) == (not with_margin)
    moved = packed.to("cpu")
    assert isinstance(moved, PreferenceBatch) and torch.equal(moved.tokens, packed.tokens)
    assert preference_batch(packed) is packed


def test_too_long_for_the_model_falls_back_to_padded():
    pairs = _pairs(with_margin=True)
    out = padding_free_collate_dpo(pairs, padding_idx=0, max_seq_len=23)
    expected = padded_collate_dpo(pairs, padding_idx=0)
    assert isinstance(out, tuple) and len(out) == 3
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want)
    assert isinstance(padding_free_collate_dpo(pairs, max_seq_len=24), dict)


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="empty batch"):
        padding_free_collate_dpo([])
    pair = _pairs(False)[0]
    pair["rejected_labels"] = pair["rejected_labels"][:-1]
    with pytest.raises(ValueError, match="Pair 0 of the batch has rejected input ids of shape"):
        padding_free_collate_dpo([pair])
    with pytest.raises(ValueError, match="padding_free_collate_dpo"):
        preference_batch([torch.zeros(1)])


def test_last_token_positions_agree():
    pairs = _pairs(with_margin=False)
    pairs[1]["rejected_input_ids"][-2:] = [0, 0]  # a sequence ending in pad-id tokens: its last real one counts
    padded = preference_batch(padded_collate_dpo(pairs, padding_idx=0))
    packed = preference_batch(padding_free_collate_dpo(pairs, padding_idx=0))
    rows, columns = padded.last_token_positions(pad_id=0)
    expected = padded.tokens[rows, columns]
    packed_rows, packed_columns = packed.last_token_positions(pad_id=0)
    torch.testing.assert_close(packed.tokens[packed_rows, packed_columns], expected)
    torch.testing.assert_close(columns, torch.tensor([4, 1, 3, 2, 3, 3]))
    torch.testing.assert_close(packed_columns, torch.tensor([4, 6, 10, 13, 17, 23]))
