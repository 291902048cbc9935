"""The collate function of unpaired feedback (KTO): the examples, their desirable flags and their KL rows."""

from collections.abc import Sequence
from typing import Any

import torch

from tune.data._common import CROSS_ENTROPY_IGNORE_IDX


def _padded(rows: list[Sequence[int]], value: int) -> torch.Tensor:
    length = max(len(row) for row in rows)
    out = torch.full((len(rows), length), value, dtype=torch.int64)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return out


def padded_collate_kto(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> dict[str, torch.Tensor]:
    """Pads unpaired examples (``tune.datasets.unpaired_preference_dataset``) into one batch, right-padded.

    Args:
        batch (Sequence[dict]): samples with ``input_ids``, ``labels`` and ``label`` (True: desirable), and, when
            the dataset builds them, ``kl_input_ids`` and ``kl_labels``.
        padding_idx (int): token id for padding. Default 0.
        ignore_idx (int): label for padding. Default -100.

    Returns:
        dict[str, torch.Tensor]: ``tokens`` and ``labels`` int64 ``[b, s]``, ``desirable`` bool ``[b]``, and, when
        the samples have KL rows, ``kl_tokens`` and ``kl_labels`` int64 ``[b, s']`` (row ``i`` is example ``i``'s
        prompt with its KL partner's completion).

    Raises:
        ValueError: when some samples have KL rows and others do not.
    """
    out = {
        "tokens": _padded([sample["input_ids"] for sample in batch], padding_idx),
        "labels": _padded([sample["labels"] for sample in batch], ignore_idx),
        "desirable": torch.tensor([bool(sample["label"]) for sample in batch], dtype=torch.bool),
    }
    with_kl = sum("kl_input_ids" in sample for sample in batch)
    if with_kl not in (0, len(batch)):
        raise ValueError(f"{with_kl} of {len(batch)} samples have KL rows (kl_input_ids); all or none must.")
    if with_kl:
        out["kl_tokens"] = _padded([sample["kl_input_ids"] for sample in batch], padding_idx)
        out["kl_labels"] = _padded([sample["kl_labels"] for sample in batch], ignore_idx)
    return out
