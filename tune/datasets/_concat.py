import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tune.data import FlatSequences, is_packed


class ConcatDataset(Dataset):
    """Several datasets read one after another as a single dataset.

    Packed and unpacked datasets cannot be mixed (their samples need different collators).

    Args:
        datasets (Sequence[Dataset]): map-style datasets.

    Raises:
        ValueError: for no datasets, or a mix of packed and unpacked ones.
    """

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        if not datasets:
            raise ValueError("ConcatDataset needs at least one dataset.")
        packed = [is_packed(ds) for ds in datasets]
        if any(packed) and not all(packed):
            raise ValueError(
                f"ConcatDataset got a mix of packed and unpacked datasets (packed: {packed}); set packed the same "
                f"on every dataset."
            )
        self.packed = all(packed)
        self._datasets = list(datasets)
        self._ends = np.cumsum([len(ds) for ds in self._datasets]).tolist()

    def __len__(self) -> int:
        return self._ends[-1]

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        which = bisect.bisect_right(self._ends, index)
        start = self._ends[which - 1] if which else 0
        return self._datasets[which][index - start]

    def as_flat_sequences(self) -> FlatSequences:
        """Flat token/label arrays of every dataset, in order (so a ConcatDataset can itself be packed)."""
        from tune.data import flatten_dataset

        return FlatSequences.concatenate([flatten_dataset(ds) for ds in self._datasets])
