"""Reference log-probabilities computed once, before training (TRL's ``precompute_ref_log_probs``).

The reference model of DPO does not change, so its sequence log-probabilities can be computed in one pass over
the training pairs and looked up by the pair's index at every step: one forward pass per step less (and, for a
full fine-tune, no reference model held during training). :class:`IndexedPairs` gives each pair its dataset index,
:func:`collate_with_indices` carries the indices through the recipe's collate, and
:func:`precompute_reference_log_probs` fills the table.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from tune.rlhf._sequence_processing import get_batch_log_probs


class IndexedPairs(Dataset):
    """A dataset whose samples come with their index: ``dataset[i]`` becomes ``(dataset[i], i)``.

    Args:
        dataset (Dataset): the preference pairs.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.dataset[index], index


def collate_with_indices(collate: Callable[[list[Any]], Sequence[torch.Tensor]]) -> Callable:
    """Wraps a pair collate (``padded_collate_dpo``) for :class:`IndexedPairs`: its output, then the indices.

    Args:
        collate (Callable): the collate of the pairs, returning ``(tokens, labels)``.

    Returns:
        Callable: ``[(pair, index), ...] -> (tokens, labels, indices [b])``.
    """

    def collate_indexed(batch: list[tuple[Any, int]]) -> tuple[torch.Tensor, ...]:
        return (*collate([pair for pair, _ in batch]), torch.tensor([index for _, index in batch]))

    return collate_indexed


@torch.no_grad()
def precompute_reference_log_probs(
    reference_logits: Callable[[torch.Tensor], torch.Tensor],
    pairs: Dataset,
    collate: Callable[[list[Any]], Sequence[torch.Tensor]],
    *,
    batch_size: int,
    device: torch.device,
    average_log_probs: bool = False,
) -> torch.Tensor:
    """The reference's chosen and rejected log-probabilities of every pair, in dataset order.

    Args:
        reference_logits (Callable[[torch.Tensor], torch.Tensor]): tokens ``[2b, s]`` -> the reference model's
            logits ``[2b, s, v]`` (for LoRA, the model under ``disable_adapter``).
        pairs (Dataset): the preference pairs (not indexed).
        collate (Callable): their collate, returning ``(tokens, labels)`` with chosen rows first, then rejected.
        batch_size (int): pairs per forward pass.
        device (torch.device): where the model runs; the table stays there.
        average_log_probs (bool): means over the completion tokens instead of sums (IPO, SimPO). Default False.

    Returns:
        torch.Tensor: ``[len(pairs), 2]`` float32: column 0 the chosen, column 1 the rejected log-probabilities.
    """
    table = torch.empty(len(pairs), 2, dtype=torch.float32, device=device)
    loader = DataLoader(pairs, batch_size=batch_size, shuffle=False, collate_fn=collate)
    start = 0
    for tokens, labels in loader:
        logits = reference_logits(tokens.to(device))
        log_probs = get_batch_log_probs(logits, labels.to(device), return_average_logprobs=average_log_probs)
        chosen, rejected = log_probs.float().chunk(2)
        table[start : start + chosen.shape[0], 0] = chosen
        table[start : start + chosen.shape[0], 1] = rejected
        start += chosen.shape[0]
        del logits
    return table
