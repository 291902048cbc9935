"""tune/data/_collate.py: `is_packed` and `collate_for_dataset`, which fit the configured collate function to the
samples of the dataset (packs get the block-causal mask whatever the config's `packed` keys say)."""

import pytest
import torch
from torch.utils.data import ConcatDataset as TorchConcatDataset

from tests._helpers import ListDataset, three_documents
from tune.data import (
    PackedDataset,
    collate_for_dataset,
    is_packed,
    padded_collate_packed,
    padded_collate_sft,
    padding_free_collate,
)
from tune.datasets import ConcatDataset

IGNORE = -100


def _packed(max_seq_len: int = 8) -> PackedDataset:
    # packs of 8: [doc0 (3) + doc1 (4) + 1 padding] and [doc2 (2) + 6 padding] (tests/tune/data/test_packing.py)
    return PackedDataset(ListDataset(three_documents()), max_seq_len=max_seq_len)


def _block_causal(seq_lens: list[int]) -> torch.Tensor:
    """[s, s] with True where query q may attend to key k: k <= q and both in the same segment (written out)."""
    document = [i for i, n in enumerate(seq_lens) for _ in range(n)]
    s = len(document)
    return torch.tensor([[document[q] == document[k] and k <= q for k in range(s)] for q in range(s)])


# ----------------------------------------------------------------------------------------------- is_packed


def test_a_packed_dataset_is_packed_and_a_plain_one_is_not():
    assert is_packed(_packed()) is True
    assert is_packed(ListDataset(three_documents())) is False
    assert is_packed([]) is False


def test_concatenations_of_packed_datasets_are_packed():
    assert is_packed(ConcatDataset([_packed(), _packed(6)])) is True
    assert is_packed(TorchConcatDataset([_packed(), _packed(6)])) is True
    # nested: a torch concatenation of tune's concatenation (its `packed` attribute) and a pack dataset
    assert is_packed(TorchConcatDataset([ConcatDataset([_packed()]), _packed()])) is True


def test_tune_concatenations_nest():
    # a dataset component may itself return a tune ConcatDataset of packs (a user's mixture); listed with other
    # packed datasets, the whole is still packs and must get the block-causal mask
    nested = ConcatDataset([ConcatDataset([_packed(), _packed()]), _packed()])
    assert is_packed(nested) is True
    only_nested = ConcatDataset([ConcatDataset([_packed()])])
    batch = collate_for_dataset(padded_collate_sft, only_nested)([only_nested[0]])
    assert torch.equal(batch["mask"][0], _block_causal([3, 4, 1]))


def test_concatenations_of_unpacked_datasets_are_not_packed():
    assert is_packed(ConcatDataset([ListDataset(three_documents()), ListDataset(three_documents())])) is False
    assert is_packed(TorchConcatDataset([ListDataset(three_documents()), ListDataset(three_documents())])) is False


def test_a_torch_concatenation_mixing_packed_and_unpacked_datasets_raises():
    mixed = TorchConcatDataset([_packed(), ListDataset(three_documents())])
    with pytest.raises(ValueError, match=r"mixes packed and unpacked datasets \(packed: \[True, False\]\)"):
        is_packed(mixed)


def test_an_object_with_packed_true_is_packed_and_odd_datasets_attributes_are_not():
    class Flagged(ListDataset):
        packed = True

    class Named(ListDataset):
        datasets = "alpaca"  # a string is a sequence, not a list of parts

    assert is_packed(Flagged(three_documents())) is True
    assert is_packed(Named(three_documents())) is False


# ------------------------------------------------------------------------------------- collate_for_dataset


def test_padded_collate_sft_on_a_packed_dataset_collates_packs():
    packed = _packed()
    collate = collate_for_dataset(padded_collate_sft, packed, padding_idx=0, ignore_idx=IGNORE)
    batch = collate([packed[0], packed[1]])
    assert sorted(batch) == ["input_pos", "labels", "mask", "tokens"]
    assert batch["input_pos"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 1, 2, 3, 4, 5]]
    assert batch["mask"].dtype == torch.bool and batch["mask"].shape == (2, 8, 8)
    assert torch.equal(batch["mask"][0], _block_causal([3, 4, 1]))
    assert torch.equal(batch["mask"][1], _block_causal([2, 6]))
    assert batch["tokens"].tolist()[0] == [1, 10, 11, 1, 20, 21, 22, 0]


@pytest.mark.parametrize("concat", [ConcatDataset, TorchConcatDataset], ids=["tune", "torch"])
def test_a_concatenation_of_packed_datasets_is_collated_as_packs(concat):
    dataset = concat([_packed(), _packed()])
    collate = collate_for_dataset(padded_collate_sft, dataset)
    batch = collate([dataset[0], dataset[3]])
    assert torch.equal(batch["mask"][0], _block_causal([3, 4, 1]))
    assert torch.equal(batch["mask"][1], _block_causal([2, 6]))


def test_padded_collate_sft_on_an_unpacked_dataset_pads_with_the_given_ids():
    collate = collate_for_dataset(padded_collate_sft, ListDataset(three_documents()), padding_idx=7, ignore_idx=-5)
    batch = collate(three_documents()[:2])
    assert sorted(batch) == ["labels", "tokens"]
    assert batch["tokens"].tolist() == [[1, 10, 11, 7], [1, 20, 21, 22]]
    assert batch["labels"].tolist() == [[-100, 10, 11, -5], [1, 20, -100, 22]]


def test_padded_collate_packed_on_an_unpacked_dataset_raises():
    with pytest.raises(ValueError, match=r"padded_collate_packed needs a packed dataset \(packed: True\)"):
        collate_for_dataset(padded_collate_packed, ListDataset(three_documents()))
    assert collate_for_dataset(padded_collate_packed, _packed()) is padded_collate_packed  # nothing to bind


def test_a_mixed_dataset_raises_for_any_collator():
    mixed = TorchConcatDataset([_packed(), ListDataset(three_documents())])
    with pytest.raises(ValueError, match="mixes packed and unpacked"):
        collate_for_dataset(padding_free_collate, mixed)


def test_padding_free_collate_gets_ignore_idx_and_max_seq_len():
    collate = collate_for_dataset(
        padding_free_collate, ListDataset(three_documents()), padding_idx=7, ignore_idx=-5, max_seq_len=7
    )
    # 3 + 4 tokens fit in one row of 7; every sample's first label becomes ignore_idx
    row = collate(three_documents()[:2])
    assert row["tokens"].tolist() == [[1, 10, 11, 1, 20, 21, 22]]
    assert row["labels"].tolist() == [[-5, 10, 11, -5, 20, -100, 22]]
    # 3 + 4 + 2 tokens do not: the padded fallback, padded with padding_idx and ignore_idx
    padded = collate(three_documents())
    assert padded["tokens"].tolist() == [[1, 10, 11, 7], [1, 20, 21, 22], [1, 30, 7, 7]]
    assert padded["labels"][2].tolist() == [1, 30, -5, -5]


def test_padding_free_collate_on_a_packed_dataset_stays_padding_free():
    packed = _packed()
    collate = collate_for_dataset(padding_free_collate, packed, max_seq_len=16)
    row = collate([packed[0], packed[1]])
    # the padding segments carry no label and are dropped: 3 + 4 + 2 tokens in one row
    assert row["tokens"].tolist() == [[1, 10, 11, 1, 20, 21, 22, 1, 30]]
    assert torch.equal(row["mask"][0], _block_causal([3, 4, 2]))


def test_only_the_arguments_a_function_takes_are_bound():
    def plain(batch):
        return batch

    def with_max_seq_len(batch, max_seq_len=None):
        return max_seq_len

    def with_ids(batch, *, padding_idx, ignore_idx):
        return padding_idx, ignore_idx

    dataset = ListDataset(three_documents())
    assert collate_for_dataset(plain, dataset, padding_idx=3) is plain
    assert collate_for_dataset(with_max_seq_len, dataset, padding_idx=3, max_seq_len=64)([]) == 64
    assert collate_for_dataset(with_ids, dataset, padding_idx=3, ignore_idx=-1, max_seq_len=64)([]) == (3, -1)
