"""A distributed sampler that can resume in the middle of an epoch, shuffled or not."""

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from tune.utils import get_rank, get_world_size


class StatefulDistributedSampler(Sampler[int]):
    """Splits a map-style dataset across ranks like ``torch.utils.data.DistributedSampler``, and remembers where
    it stopped so a resumed run continues with exactly the samples an uninterrupted run would see.

    Each epoch draws a permutation from ``seed + epoch`` (the same on every rank), pads it (or drops the tail with
    ``drop_last``) to a multiple of ``num_replicas`` and gives rank ``r`` every ``num_replicas``-th index from
    ``r``. :meth:`state_dict` records the epoch and how many of this rank's samples were consumed;
    after :meth:`load_state_dict`, iterating that epoch again skips them.

    Call :meth:`set_epoch` at the start of every epoch, as with ``DistributedSampler``.

    Args:
        dataset (Sized): the dataset (only its length is used).
        num_replicas (int | None): number of ranks; default the world size.
        rank (int | None): this rank; default the process rank.
        shuffle (bool): shuffle each epoch. Default True.
        seed (int): base seed of the permutation; identical on all ranks. Default 0.
        drop_last (bool): drop the tail so every rank gets the same number of samples without repeats, instead
            of padding with repeated samples. Default False.

    Raises:
        ValueError: if ``rank`` is not in ``[0, num_replicas)``.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.dataset = dataset
        self.num_replicas = get_world_size() if num_replicas is None else num_replicas
        self.rank = get_rank() if rank is None else rank
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas}), got rank={self.rank}.")
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._start_index = 0  # samples of this rank already consumed in `_start_epoch`
        self._start_epoch = 0
        self._yielded = 0  # samples of this rank handed out in the current epoch, counting the skipped ones

    @property
    def num_samples(self) -> int:
        """Samples per rank in a whole epoch."""
        size = len(self.dataset)
        if self.drop_last:
            return size // self.num_replicas
        return math.ceil(size / self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (and so the permutation) of the next iteration.

        Args:
            epoch (int): the epoch about to start (or resume).
        """
        self.epoch = epoch

    def _skip(self) -> int:
        return self._start_index if self.epoch == self._start_epoch else 0

    def _indices(self) -> list[int]:
        size = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(size, generator=generator).tolist()
        else:
            indices = list(range(size))
        total = self.num_samples * self.num_replicas
        if total > len(indices):  # pad by repeating from the start, as DistributedSampler does
            repeats = math.ceil((total - len(indices)) / max(len(indices), 1))
            indices = (indices + indices * repeats)[:total]
        return indices[:total][self.rank : total : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        start = self._skip()
        self._yielded = start
        for index in self._indices()[start:]:
            self._yielded += 1
            yield index
        # The epoch was finished: a later iteration of the same epoch starts from its beginning.
        if self.epoch == self._start_epoch:
            self._start_index = 0

    def __len__(self) -> int:
        """Samples the next iteration yields (fewer than :attr:`num_samples` when resuming mid-epoch)."""
        return self.num_samples - self._skip()

    def state_dict(self, num_consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from.

        Args:
            num_consumed (int | None): samples of this rank consumed so far in the current epoch (batches consumed
                times the batch size). ``None`` uses how many the sampler has handed out, which equals it for a
                ``DataLoader`` with ``num_workers=0``; with worker processes the loader prefetches, so pass it.

        Returns:
            dict[str, Any]: plain values (``epoch``, ``num_consumed``, and what must match on resume).
        """
        consumed = self._yielded if num_consumed is None else int(num_consumed)
        return {
            "epoch": self.epoch,
            "num_consumed": consumed,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_replicas": self.num_replicas,
            "dataset_size": len(self.dataset),
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes from :meth:`state_dict`: the next iteration of ``state["epoch"]`` skips the consumed samples.

        Args:
            state (dict[str, Any]): what :meth:`state_dict` returned.

        Raises:
            ValueError: if the dataset size, seed, shuffling or number of ranks differ from the saved run (the
                order of samples would differ, so the resume would not continue the same run).
        """
        current = self.state_dict(0)
        changed = [
            f"{key}: saved {state[key]!r}, now {current[key]!r}"
            for key in ("seed", "shuffle", "num_replicas", "dataset_size", "drop_last")
            if key in state and state[key] != current[key]
        ]
        if changed:
            raise ValueError(
                "Cannot resume the data loader where it stopped because the data setup changed ("
                + "; ".join(changed)
                + "). Resume with the same dataset, seed, shuffle, drop_last and number of processes."
            )
        self.epoch = self._start_epoch = int(state["epoch"])
        self._start_index = min(int(state["num_consumed"]), self.num_samples)
        self._yielded = self._start_index
