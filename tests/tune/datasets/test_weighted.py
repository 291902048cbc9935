from collections import Counter

import pytest
from torch.utils.data import Dataset

from tune.datasets import WeightedDataset


class Labelled(Dataset):
    def __init__(self, name, n):
        self.name, self.n = name, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (self.name, i)


def test_proportions_follow_weights_and_no_repeats_before_exhaustion():
    mix = WeightedDataset([Labelled("a", 100), Labelled("b", 10)], weights=[3, 1], num_samples=80, seed=1)
    items = [mix[i] for i in range(len(mix))]
    counts = Counter(name for name, _ in items)
    assert counts == {"a": 60, "b": 20}  # 80 * 3/4 and 80 * 1/4
    a_indices = [i for name, i in items if name == "a"]
    assert len(set(a_indices)) == 60  # 60 <= 100: drawn without repetition
    b_indices = Counter(i for name, i in items if name == "b")
    assert set(b_indices.values()) == {2}  # 20 from 10: each sample exactly twice (two permutations)


def test_seeded_and_reproducible():
    make = lambda seed: WeightedDataset([Labelled("a", 5), Labelled("b", 5)], [1, 1], seed=seed)  # noqa: E731
    first, again, other = make(0), make(0), make(1)
    assert [first[i] for i in range(10)] == [again[i] for i in range(10)]
    assert [first[i] for i in range(10)] != [other[i] for i in range(10)]


def test_default_length_and_largest_remainder():
    mix = WeightedDataset([Labelled("a", 4), Labelled("b", 3), Labelled("c", 3)], [1, 1, 1])
    assert len(mix) == 10
    assert Counter(mix[i][0] for i in range(10)) == {"a": 4, "b": 3, "c": 3}  # 10/3 each; the first remainder wins


@pytest.mark.parametrize("weights, match", [([1], "one weight per dataset"), ([0, 0], "not all zero"),
                                            ([-1, 2], "non-negative")])  # fmt: skip
def test_bad_weights(weights, match):
    with pytest.raises(ValueError, match=match):
        WeightedDataset([Labelled("a", 2), Labelled("b", 2)], weights)
