"""A custom loss as a torchtune user writes it: the MEAN cross-entropy over the scored tokens, no ``reduction``.

torchtune's recipes multiply such a loss by the micro-batch's token count; tune's recipes must do the same, so a
run with it logs and trains exactly as one with tune's built-in cross-entropy (tests/recipes/test_loss_reduction.py).
"""

import torch
import torch.nn.functional as F
from torch import nn


class TorchtuneMeanLoss(nn.Module):
    """Mean token cross-entropy of ``[b, s, vocab]`` logits against shifted ``[b, s]`` labels.

    Args:
        ignore_index (int): the label value that carries no loss.
    """

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat_logits = logits.reshape(-1, logits.shape[-1]).float()
        return F.cross_entropy(flat_logits, labels.reshape(-1), ignore_index=self.ignore_index)
