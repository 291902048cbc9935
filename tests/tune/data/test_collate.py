import pytest
import torch

from tune.data import (
    block_causal_mask,
    left_pad_sequence,
    padded_collate,
    padded_collate_dpo,
    padded_collate_generation,
    padded_collate_packed,
    padded_collate_sft,
)


class TestPaddedCollateSFT:
    def test_pads_tokens_with_pad_id_and_labels_with_ignore(self):
        batch = [{"tokens": [1, 5, 6], "labels": [-100, 5, 6]}, {"tokens": [1, 7], "labels": [1, 7]}]
        out = padded_collate_sft(batch, padding_idx=9)
        assert out["tokens"].tolist() == [[1, 5, 6], [1, 7, 9]]
        assert out["labels"].tolist() == [[-100, 5, 6], [1, 7, -100]]
        assert out["tokens"].dtype == out["labels"].dtype == torch.int64

    def test_pad_to_multiple_of(self):
        batch = [{"tokens": [1] * 5, "labels": [1] * 5}, {"tokens": torch.tensor([2, 3]), "labels": [2, 3]}]
        out = padded_collate_sft(batch, pad_to_multiple_of=4)
        assert out["tokens"].shape == (2, 8)  # longest 5 rounded up to a multiple of 4
        # -100 exactly on padding: 3 padded positions in row 0, 6 in row 1
        assert (out["labels"] == -100).sum(dim=1).tolist() == [3, 6]

    def test_rejects_mismatched_lengths_and_bad_multiple(self):
        with pytest.raises(ValueError, match="Sample 0 .* 2 tokens but 1 labels"):
            padded_collate_sft([{"tokens": [1, 2], "labels": [1]}])
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            padded_collate_sft([{"tokens": [1], "labels": [1]}], pad_to_multiple_of=0)


def test_left_pad_sequence_matches_manual_layout():
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    assert left_pad_sequence(seqs, batch_first=True, padding_value=0).tolist() == [[1, 2, 3], [0, 0, 4]]
    assert left_pad_sequence(seqs, padding_value=-1).tolist() == [[1, -1], [2, -1], [3, 4]]  # [s, b]


def test_padded_collate_generic_left_and_right():
    batch = [{"a": [1, 2], "b": [3], "id": "x"}, {"a": [4], "b": [5, 6], "id": "y"}]
    out = padded_collate(batch, pad_direction="left", keys_to_pad=["a", "b"], padding_idx={"a": 0, "b": -1})
    assert out["a"].tolist() == [[1, 2], [0, 4]] and out["b"].tolist() == [[-1, 3], [5, 6]]
    assert out["id"] == ["x", "y"]
    with pytest.raises(ValueError, match="pad_direction"):
        padded_collate(batch, pad_direction="up", keys_to_pad=["a"], padding_idx=0)


def test_padded_collate_dpo_chosen_then_rejected():
    batch = [
        {"chosen_input_ids": [1, 2], "chosen_labels": [-100, 2],
         "rejected_input_ids": [1, 3, 3], "rejected_labels": [-100, 3, 3]},
        {"chosen_input_ids": [1], "chosen_labels": [1], "rejected_input_ids": [1, 4], "rejected_labels": [-100, 4]},
    ]  # fmt: skip
    tokens, labels = padded_collate_dpo(batch, padding_idx=0)
    assert tokens.tolist() == [[1, 2, 0], [1, 0, 0], [1, 3, 3], [1, 4, 0]]
    assert labels.tolist() == [[-100, 2, -100], [1, -100, -100], [-100, 3, 3], [-100, 4, -100]]


def test_padded_collate_generation_left_pads_with_positions():
    out = padded_collate_generation([{"tokens": [5, 6, 7]}, {"tokens": [8]}], padding_idx=0)
    assert out["tokens"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert out["padding_mask"].tolist() == [[True, True, True], [False, False, True]]
    assert out["input_pos"].tolist() == [[0, 1, 2], [0, 0, 0]]


def _reference_block_causal(seq_lens: list[list[int]]) -> torch.Tensor:
    """Element by element: q may see k iff same document and k <= q."""
    s = sum(seq_lens[0])
    mask = torch.zeros(len(seq_lens), s, s, dtype=torch.bool)
    for b, lens in enumerate(seq_lens):
        doc = [i for i, n in enumerate(lens) for _ in range(n)]
        for q in range(s):
            for k in range(s):
                mask[b, q, k] = doc[q] == doc[k] and k <= q
    return mask


def test_block_causal_mask_matches_elementwise_reference():
    seq_lens = [[3, 2, 1], [6], [1, 1, 4]]
    got = block_causal_mask([torch.tensor(x) for x in seq_lens], max_seq_len=6)
    assert torch.equal(got, _reference_block_causal(seq_lens))


def test_block_causal_mask_rejects_unequal_totals():
    with pytest.raises(ValueError, match="sum to the same length"):
        block_causal_mask([torch.tensor([2, 2]), torch.tensor([3])])


def test_padded_collate_packed_stacks_and_builds_mask():
    packs = [
        {"tokens": torch.arange(4), "labels": torch.tensor([-100, 1, -100, 3]), "input_pos": torch.tensor([0, 1, 0, 1]),
         "seq_lens": torch.tensor([2, 2])},
        {"tokens": torch.arange(4), "labels": torch.tensor([-100, 1, 2, -100]), "input_pos": torch.tensor([0, 1, 2, 0]),
         "seq_lens": torch.tensor([3, 1])},
    ]  # fmt: skip
    out = padded_collate_packed(packs)
    assert out["tokens"].shape == out["labels"].shape == out["input_pos"].shape == (2, 4)
    assert torch.equal(out["mask"], _reference_block_causal([[2, 2], [3, 1]]))
