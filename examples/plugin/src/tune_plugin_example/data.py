"""A dataset builder: synthetic token sequences, usable as ``dataset: {_component_: tune_example_dataset}``."""

import torch
from torch.utils.data import Dataset

from tune.data import CROSS_ENTROPY_IGNORE_IDX


class _Sequences(Dataset):
    def __init__(self, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        self._tokens, self._labels = tokens, labels

    def __len__(self) -> int:
        return self._tokens.shape[0]

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"tokens": self._tokens[index].tolist(), "labels": self._labels[index].tolist()}


def affine_sequence_dataset(
    num_samples: int = 256, seq_len: int = 16, vocab_size: int = 32, multiplier: int = 5, offset: int = 3, seed: int = 0
) -> Dataset:
    """Sequences that follow ``token[t + 1] = (multiplier * token[t] + offset) mod vocab_size``.

    Samples are dicts with ``tokens`` and ``labels`` (lists of ints, like tune's dataset builders return); labels
    are the tokens themselves (the loss shifts them by one), except the first one, which is not predictable
    from a previous token and is masked with ``CROSS_ENTROPY_IGNORE_IDX``.

    Args:
        num_samples (int): number of sequences. Default 256.
        seq_len (int): tokens per sequence. Default 16.
        vocab_size (int): tokens are in ``[0, vocab_size)``. Default 32.
        multiplier (int): the rule's multiplier. Default 5.
        offset (int): the rule's offset. Default 3.
        seed (int): seed of the random first tokens. Default 0.

    Returns:
        Dataset: the samples.

    Raises:
        ValueError: for non-positive sizes.
    """
    if min(num_samples, seq_len, vocab_size) <= 0:
        raise ValueError(
            f"num_samples, seq_len and vocab_size must be positive, got {num_samples}, {seq_len}, {vocab_size}"
        )
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.empty(num_samples, seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab_size, (num_samples,), generator=generator)
    for t in range(1, seq_len):
        tokens[:, t] = (multiplier * tokens[:, t - 1] + offset) % vocab_size
    labels = tokens.clone()
    labels[:, 0] = CROSS_ENTROPY_IGNORE_IDX
    return _Sequences(tokens, labels)
