"""A user's own components, named by `_component_` in the recipe tests: a collator class configured by keyword
arguments, and an optimizer whose ``step()`` returns metrics for the recipe to log."""

from typing import Any

import torch

from tune.data import padded_collate_sft


class PadToMultipleCollator:
    """Right-pads a batch like ``padded_collate_sft`` and rounds its length up to a multiple.

    Args:
        pad_to_multiple_of (int): the multiple.
        padding_idx (int): token id of padding.
    """

    def __init__(self, pad_to_multiple_of: int, padding_idx: int = 0) -> None:
        self.pad_to_multiple_of = pad_to_multiple_of
        self.padding_idx = padding_idx

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = padded_collate_sft(samples, padding_idx=self.padding_idx, pad_to_multiple_of=self.pad_to_multiple_of)
        assert batch["tokens"].shape[1] % self.pad_to_multiple_of == 0
        return batch


class AdamWWithUpdateNorm(torch.optim.AdamW):
    """AdamW whose ``step()`` returns ``{"update_norm": ||new - old||}`` over all parameters (a 0-d tensor)."""

    def step(self, closure=None) -> dict[str, torch.Tensor]:
        before = [p.detach().clone() for group in self.param_groups for p in group["params"]]
        super().step(closure)
        after = [p.detach() for group in self.param_groups for p in group["params"]]
        return {"update_norm": torch.linalg.vector_norm(torch.stack([(a - b).norm() for a, b in zip(after, before)]))}
