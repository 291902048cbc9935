"""Pooling helpers: where each sequence of a padded batch ends (the position a classifier reads)."""

import torch

__all__ = ["get_unmasked_sequence_lengths"]


def get_unmasked_sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """The index of the last position of each row that is not masked (padding), as torchtune's reward models use it.

    Args:
        mask (torch.Tensor): ``[b, s]`` booleans, True at padding positions (e.g. ``tokens == pad_id``).

    Returns:
        torch.Tensor: ``[b]`` int64 indices; 0 for a row that is all padding.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(~mask, positions, -1).amax(dim=-1)  # -1 where the whole row is padding
    return last.clamp(min=0).to(torch.long)
