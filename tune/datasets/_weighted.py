from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tune.utils import get_logger

_log = get_logger(name=__name__)


def _counts(weights: np.ndarray, total: int) -> np.ndarray:
    """Splits ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    exact = weights / weights.sum() * total
    counts = np.floor(exact).astype(np.int64)
    remainder = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:remainder]] += 1
    return counts


class WeightedDataset(Dataset):
    """Mixes datasets in fixed proportions, reproducibly.

    ``num_samples`` items are drawn so that dataset ``i`` contributes ``weights[i] / sum(weights)`` of them
    (rounded by largest remainder). Within a dataset samples are taken in a seeded random order without
    repetition, starting a new permutation when a dataset is used more than once over (upsampling); the mixed
    list is then shuffled with the same seed. The result is a fixed map-style dataset, so a sampler and a
    resumed run see the same items.

    Args:
        datasets (Sequence[Dataset]): map-style datasets with compatible samples.
        weights (Sequence[float]): non-negative mixing weights, one per dataset, not all zero.
        seed (int): seed of the draw. Default 0.
        num_samples (int | None): length of the mix. Default: the sum of the datasets' lengths.

    Raises:
        ValueError: for mismatched lengths, negative or all-zero weights, or an empty dataset with weight > 0.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        weights: Sequence[float],
        *,
        seed: int = 0,
        num_samples: int | None = None,
    ) -> None:
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"Got {len(datasets)} datasets and {len(weights)} weights; give one weight per dataset.")
        w = np.asarray(weights, dtype=np.float64)
        if (w < 0).any() or not w.sum() > 0:
            raise ValueError(f"weights must be non-negative and not all zero, got {list(weights)}.")
        sizes = [len(ds) for ds in datasets]
        empty = [i for i, (n, wi) in enumerate(zip(sizes, w)) if n == 0 and wi > 0]
        if empty:
            raise ValueError(f"Dataset(s) {empty} are empty but have a positive weight.")
        total = sum(sizes) if num_samples is None else num_samples
        rng = np.random.default_rng(seed)
        counts = _counts(w, total)
        which, local = [], []
        for i, (count, size) in enumerate(zip(counts.tolist(), sizes)):
            if count == 0:
                continue
            repeats = -(-count // size)
            order = np.concatenate([rng.permutation(size) for _ in range(repeats)])[:count]
            which.append(np.full(count, i, dtype=np.int32))
            local.append(order.astype(np.int64))
        shuffle = rng.permutation(total)
        self._which = np.concatenate(which)[shuffle]
        self._local = np.concatenate(local)[shuffle]
        self._datasets = list(datasets)
        _log.info(f"WeightedDataset: {total:,} samples, per dataset {counts.tolist()} (sizes {sizes}).")

    def __len__(self) -> int:
        return len(self._which)

    def __getitem__(self, index: int) -> Any:
        return self._datasets[int(self._which[index])][int(self._local[index])]
