"""A loss that turns NaN after a number of calls: drives the recipes' non-finite-loss stop in the tests."""

import torch

from tune.modules.loss import LinearCrossEntropyLoss


class NaNAfterNCalls(LinearCrossEntropyLoss):
    """``LinearCrossEntropyLoss`` whose first ``num_finite_calls`` calls are normal and every later one is NaN.

    Args:
        num_finite_calls (int): calls (micro-batches) computed normally.
        **kwargs: passed to :class:`LinearCrossEntropyLoss`.
    """

    def __init__(self, num_finite_calls: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_finite_calls = num_finite_calls
        self.calls = 0

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, output=None) -> torch.Tensor:
        self.calls += 1
        loss = super().forward(hidden, labels, output)
        return loss if self.calls <= self.num_finite_calls else loss * float("nan")
