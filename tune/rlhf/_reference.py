"""Reference log-probabilities computed once, before training (TRL's ``precompute_ref_log_probs``).

The reference model of DPO does not change, so its sequence log-probabilities can be computed in one pass over
the training pairs and looked up by the pair's index at every step: one forward pass per step less (and, for a
full fine-tune, no reference model held during training). :class:`IndexedPairs` gives each pair its dataset index,
:func:`collate_with_indices` carries the indices through the recipe's collate, and
:func:`precompute_reference_log_probs` fills the table, on one device or split over the ranks of an FSDP run.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tune.data import PreferenceBatch, preference_batch
from tune.rlhf._sequence_processing import model_sequence_log_probs


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


def collate_with_indices(collate: Callable[[list[Any]], Any]) -> Callable:
    """Wraps a pair collate (``padded_collate_dpo``, ``padding_free_collate_dpo``) for :class:`IndexedPairs`: its
    output as a :class:`~tune.data.PreferenceBatch`, then the indices.

    Args:
        collate (Callable): the collate of the pairs.

    Returns:
        Callable: ``[(pair, index), ...] -> (PreferenceBatch, indices [b])``.
    """

    def collate_indexed(batch: list[tuple[Any, int]]) -> tuple[PreferenceBatch, torch.Tensor]:
        return preference_batch(collate([pair for pair, _ in batch])), torch.tensor([index for _, index in batch])

    return collate_indexed


@torch.no_grad()
def precompute_reference_log_probs(
    reference_logits: nn.Module | Callable[[torch.Tensor], torch.Tensor],
    pairs: Dataset,
    collate: Callable[[list[Any]], Sequence[torch.Tensor]],
    *,
    batch_size: int,
    device: torch.device,
    average_log_probs: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The reference's chosen and rejected log-probabilities of every pair, in dataset order.

    With a ``process_group`` (the data-parallel ranks of an FSDP run) the work is split: each rank scores the
    pairs of its shard of a non-shuffled :class:`~torch.utils.data.distributed.DistributedSampler` (every rank
    runs the same number of forward passes, so that the sharded model's collectives stay in lockstep), then the
    shards are all-gathered and every rank returns the whole table. The sampler's padding (the first pairs
    repeated so that the shards have equal lengths) is scored twice and kept once.

    Args:
        reference_logits (nn.Module | Callable[[torch.Tensor], torch.Tensor]): the reference model, or a function
            of the tokens ``[2b, s]`` returning its logits ``[2b, s, v]``. A decoder with ``output`` and
            ``skip_output_layer`` (any ``tune`` model) is scored from its hidden states, only the completion
            positions projected (:func:`~tune.rlhf.model_sequence_log_probs`). For LoRA, call this function under
            ``disable_adapter(model)``.
        pairs (Dataset): the preference pairs (not indexed).
        collate (Callable): their collate (``padded_collate_dpo``, ``padding_free_collate_dpo``): chosen
            sequences first, then rejected ones.
        batch_size (int): pairs per forward pass (per rank).
        device (torch.device): where the model runs; the table stays there (under NCCL, a GPU).
        average_log_probs (bool): means over the completion tokens instead of sums (IPO, SimPO). Default False.
        process_group (dist.ProcessGroup | None): the ranks that share the pairs; every one of them must call this
            function. None (default): this process scores every pair itself.

    Returns:
        torch.Tensor: ``[len(pairs), 2]`` float32: column 0 the chosen, column 1 the rejected log-probabilities.
    """
    sampler = None
    if process_group is not None:
        num_ranks, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        sampler = DistributedSampler(pairs, num_replicas=num_ranks, rank=rank, shuffle=False)
    loader = DataLoader(
        IndexedPairs(pairs), batch_size=batch_size, sampler=sampler, collate_fn=collate_with_indices(collate)
    )
    values = [torch.empty(0, 2, dtype=torch.float32, device=device)]  # [b, 2] per batch: chosen, rejected
    indices = [torch.empty(0, dtype=torch.long)]  # the pairs' dataset indices [b] per batch
    for batch, batch_indices in loader:
        batch = batch.to(device)
        scores = model_sequence_log_probs(
            reference_logits, batch.tokens, batch.labels, average_log_probs=average_log_probs, **batch.packed
        )
        values.append(torch.stack(scores.log_probs.float().chunk(2), dim=1))
        indices.append(batch_indices)
    values, indices = torch.cat(values), torch.cat(indices).to(device)
    if process_group is not None:  # every shard has the same length: one all-gather of each
        values, indices = _gather(values, process_group), _gather(indices, process_group)
    # where each pair's log-probs first appear (a padding duplicate comes later): [len(pairs)]
    positions = torch.arange(indices.numel(), device=device)
    first = torch.full((len(pairs),), indices.numel(), dtype=torch.long, device=device)
    first.scatter_reduce_(0, indices, positions, reduce="amin")
    assert bool((first < indices.numel()).all()), "a pair was scored by no rank"
    return values[first]


def _gather(tensor: torch.Tensor, process_group: dist.ProcessGroup) -> torch.Tensor:
    # the ranks' tensors (all of one shape) concatenated in rank order
    shards = [torch.empty_like(tensor) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(shards, tensor.contiguous(), group=process_group)
    return torch.cat(shards)
