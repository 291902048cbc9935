"""Learning-rate schedules (Hugging Face / torchtune semantics) as ``LambdaLR`` objects, and ``get_lr``.

Each schedule multiplies the optimizer's initial learning rate by a factor of the step: a linear warmup from 0
over ``num_warmup_steps``, then the named decay. ``LambdaLR`` keeps its state in ``state_dict``, so a resumed run
continues the schedule where it stopped.
"""

import math

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = [
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_linear_schedule_with_warmup",
    "get_lr",
]


def _check_steps(num_warmup_steps: int, num_training_steps: int | None = None) -> None:
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be >= 0; received {num_warmup_steps}.")
    if num_training_steps is not None and num_training_steps < 0:
        raise ValueError(f"num_training_steps must be >= 0; received {num_training_steps}.")


def _warmup(step: int, num_warmup_steps: int) -> float:
    return step / max(1, num_warmup_steps)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then cosine decay to 0 over the remaining steps.

    The factor after warmup is ``0.5 * (1 + cos(2 * pi * num_cycles * progress))`` with ``progress`` going from 0
    to 1 between the end of warmup and ``num_training_steps``; ``num_cycles=0.5`` is one half-cosine, 1 -> 0.

    Args:
        optimizer (Optimizer): the optimizer whose learning rates to schedule.
        num_warmup_steps (int): steps of linear warmup from 0.
        num_training_steps (int): total number of optimizer steps.
        num_cycles (float): number of cosine periods after warmup.
        last_epoch (int): index of the last step, for resuming (``-1`` starts fresh).

    Returns:
        LambdaLR: the scheduler; call ``scheduler.step()`` after each ``optimizer.step()``.

    Raises:
        ValueError: for negative step counts.
    """
    _check_steps(num_warmup_steps, num_training_steps)

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return _warmup(step, num_warmup_steps)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress)))

    return LambdaLR(optimizer, factor, last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then linear decay to 0 at ``num_training_steps``.

    Args:
        optimizer (Optimizer): the optimizer whose learning rates to schedule.
        num_warmup_steps (int): steps of linear warmup from 0.
        num_training_steps (int): total number of optimizer steps.
        last_epoch (int): index of the last step, for resuming (``-1`` starts fresh).

    Returns:
        LambdaLR: the scheduler.

    Raises:
        ValueError: for negative step counts.
    """
    _check_steps(num_warmup_steps, num_training_steps)

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return _warmup(step, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return LambdaLR(optimizer, factor, last_epoch)


def get_constant_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then the initial learning rate unchanged.

    Args:
        optimizer (Optimizer): the optimizer whose learning rates to schedule.
        num_warmup_steps (int): steps of linear warmup from 0.
        num_training_steps (int | None): accepted so every schedule takes the same arguments from a recipe;
            unused.
        last_epoch (int): index of the last step, for resuming (``-1`` starts fresh).

    Returns:
        LambdaLR: the scheduler.

    Raises:
        ValueError: for a negative ``num_warmup_steps``.
    """
    _check_steps(num_warmup_steps, num_training_steps)

    def factor(step: int) -> float:
        return _warmup(step, num_warmup_steps) if step < num_warmup_steps else 1.0

    return LambdaLR(optimizer, factor, last_epoch)


def get_lr(optimizer: Optimizer | object) -> float:
    """The learning rate the optimizer will use next (its first parameter group's).

    Parameter groups normally share one rate. When they differ (a gradual-unfreezing phase with its own rate,
    say), this is the rate of the first group; read ``optimizer.param_groups[i]["lr"]`` for the others.

    Args:
        optimizer (Optimizer | object): a ``torch.optim.Optimizer``, or any object with ``param_groups``
            (``tune.training.OptimizerInBackward`` included).

    Returns:
        float: the learning rate.

    Raises:
        ValueError: if the optimizer has no parameter groups.
    """
    groups = list(optimizer.param_groups)
    if not groups:
        raise ValueError(f"{type(optimizer).__name__} has no parameter groups, so it has no learning rate.")
    lr = groups[0]["lr"]
    return float(lr.item() if torch.is_tensor(lr) else lr)
