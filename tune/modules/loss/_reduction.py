"""What the number a loss returns means, and how a recipe gets the meaning it needs.

A token loss declares its reduction in a ``reduction`` attribute, as ``nn.CrossEntropyLoss`` does: ``"mean"`` over
the non-ignored labels of the call (torchtune's convention and the default of tune's losses) or ``"sum"`` of the
token losses. A loss without the attribute is read as a mean, since that is what a loss written for torchtune
returns. :class:`ReducedLoss` turns one into the other, so a recipe that normalises the sum over a whole step trains
the same model whichever the loss returns.
"""

import logging

import torch
from torch import nn

from tune.utils import get_logger, log_rank_zero

log = get_logger(name="tune.modules.loss")

LOSS_REDUCTIONS = ("sum", "mean")
# the label tune's data marks as "no loss" (tune.data.CROSS_ENTROPY_IGNORE_IDX; modules cannot import data)
_IGNORE_INDEX = -100

_reported_undeclared: set[str] = set()  # classes already named in the "no reduction declared" line


def _qualified_name(loss_fn: object) -> str:
    cls = type(loss_fn)
    return f"{cls.__module__}.{cls.__qualname__}"


def loss_reduction(loss_fn: object) -> str:
    """The reduction a token loss declares: ``"sum"`` or ``"mean"``.

    Read from its ``reduction`` attribute. A loss without one is a mean (what torchtune's recipes expect of a
    loss); the first time a class is met this way, an info line names it and how to declare a sum.

    Args:
        loss_fn (object): the loss, e.g. ``tune.modules.loss.LinearCrossEntropyLoss``, ``nn.CrossEntropyLoss`` or
            a user's module.

    Returns:
        str: ``"sum"`` or ``"mean"``.

    Raises:
        ValueError: when ``reduction`` is set to anything else (``"none"`` included: a training step needs one
            number per micro-batch).
    """
    name = _qualified_name(loss_fn)
    if not hasattr(loss_fn, "reduction"):
        if name not in _reported_undeclared:
            _reported_undeclared.add(name)
            log_rank_zero(
                log,
                f"loss: {name} declares no `reduction`, so its value is taken as the MEAN over the non-ignored "
                'labels (torchtune\'s convention). If it returns the sum over tokens, set `reduction = "sum"` on '
                "the class.",
                logging.INFO,
            )
        return "mean"
    reduction = loss_fn.reduction
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"loss: {name}.reduction is {reduction!r}; a training loss returns one number per micro-batch, its "
            "'mean' over the non-ignored labels or their 'sum'. Set loss.reduction to 'mean' or 'sum'."
        )
    return reduction


class ReducedLoss(nn.Module):
    """A token loss re-expressed with another reduction: a mean turned into the sum, or a sum into the mean.

    The number of tokens is the number of labels not equal to ``ignore_index`` in the call's labels (the second
    argument of the loss). A call without such labels gives 0 (a mean over no tokens is NaN in PyTorch).

    Args:
        loss_fn (nn.Module): the loss, called as ``loss_fn(outputs, labels, *args, **kwargs)``.
        from_reduction (str): what ``loss_fn`` returns, ``"mean"`` or ``"sum"`` (see :func:`loss_reduction`).
        reduction (str): what this module returns, ``"sum"`` or ``"mean"``.
        ignore_index (int | None): the label value that carries no loss; ``None`` (default) takes the loss's own
            ``ignore_index`` attribute, or -100 (tune's ``CROSS_ENTROPY_IGNORE_IDX``) when it has none.

    Raises:
        ValueError: for a reduction other than ``"sum"`` or ``"mean"``.

    Example:
        >>> loss_fn = ReducedLoss(MyMeanLoss(), from_reduction="mean", reduction="sum")
        >>> loss_fn(logits, labels)  # MyMeanLoss()(logits, labels) * (labels != -100).sum()
    """

    def __init__(
        self, loss_fn: nn.Module, from_reduction: str, reduction: str = "sum", ignore_index: int | None = None
    ) -> None:
        super().__init__()
        for value in (from_reduction, reduction):
            if value not in LOSS_REDUCTIONS:
                raise ValueError(f"reduction must be one of {LOSS_REDUCTIONS}; received {value!r}.")
        self.loss_fn = loss_fn
        self.from_reduction = from_reduction
        self.reduction = reduction
        self.ignore_index = getattr(loss_fn, "ignore_index", _IGNORE_INDEX) if ignore_index is None else ignore_index

    def forward(self, outputs, labels: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """Calls the wrapped loss and rescales its value by the number of scored labels.

        Args:
            outputs: the model's output, passed through.
            labels (torch.Tensor): the labels, passed through and counted.
            *args: passed through.
            **kwargs: passed through.

        Returns:
            torch.Tensor: the loss with this module's ``reduction``.
        """
        loss = self.loss_fn(outputs, labels, *args, **kwargs)
        if self.from_reduction == self.reduction:
            return loss
        num_tokens = (labels != self.ignore_index).sum()  # on the labels' device: no host sync
        if self.reduction == "sum":
            # where, not a product alone: NaN (a mean over no tokens) times 0 is still NaN
            return torch.where(num_tokens > 0, loss * num_tokens, torch.zeros_like(loss))
        return loss / num_tokens.clamp(min=1)
