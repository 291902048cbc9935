"""Loss normalisation over a whole training step: the one piece of math every recipe must share.

A step's gradient must equal that of one big batch holding all of the step's micro-batches on all ranks:
``grad( sum of token losses / number of loss tokens )``. Each micro-batch therefore computes a SUM of token
losses, and the sum is scaled by ``world_size / global_loss_tokens``: the token count covers every micro-batch of
the step and every rank, and ``world_size`` undoes the averaging of gradients that FSDP/DDP perform.

Two equivalent ways to apply it (the tests check both against one big batch):

1. Counts first: ``scale = step_loss_scale(sum(num_loss_tokens(l) for l in step_labels))``, then each
   micro-batch runs ``(loss_sum * scale).backward()``.
2. Counts as you go: each micro-batch runs ``loss_sum.backward()`` and adds ``num_loss_tokens(labels)`` to a
   running tensor; after the last one, ``scale_grads(model, step_loss_scale(running))``.

Neither synchronises with the device: counts stay tensors until a logging step reads them.
"""

from collections.abc import Iterable

import torch
from torch import nn

from tune.training._distributed import all_reduce_sum
from tune.utils import get_world_size


def num_loss_tokens(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Number of positions that contribute to the loss, as a 0-d int64 tensor on the labels' device.

    Args:
        labels (torch.Tensor): labels already shifted (``tune.modules.loss.shift_labels``), any shape.
        ignore_index (int): label value that contributes no loss.

    Returns:
        torch.Tensor: the count (no host-device sync).
    """
    return (labels != ignore_index).sum()


def step_loss_scale(num_tokens: torch.Tensor | int, world_size: int | None = None) -> torch.Tensor:
    """The factor that turns summed micro-batch losses into the step's per-token mean loss gradient.

    Sums ``num_tokens`` over ranks when a process group is initialised (a collective: every rank must call it at
    the same point), then returns ``world_size / max(total, 1)``. The clamp keeps a step whose labels are all
    ignored from dividing by zero: its summed loss is 0, so its gradients stay 0.

    Args:
        num_tokens (torch.Tensor | int): this rank's loss-token count for the whole step (all micro-batches).
        world_size (int | None): data-parallel ranks whose gradients get averaged; default: the process group's.

    Returns:
        torch.Tensor: 0-d fp32 factor on the count's device.
    """
    count = torch.as_tensor(num_tokens).to(torch.float32)
    count = all_reduce_sum(count)
    world_size = get_world_size() if world_size is None else world_size
    return world_size / count.clamp(min=1.0)


@torch.no_grad()
def scale_grads(model: nn.Module | Iterable[torch.Tensor], scaler: torch.Tensor | float) -> None:
    """Multiplies every existing ``.grad`` in place by ``scaler`` (sharded DTensor gradients included).

    Args:
        model (nn.Module | Iterable[torch.Tensor]): a model, or its parameters.
        scaler (torch.Tensor | float): the factor, e.g. from :func:`step_loss_scale`.
    """
    params = model.parameters() if isinstance(model, nn.Module) else model
    for param in params:
        if param.grad is None:
            continue
        factor = scaler.to(param.grad.device) if torch.is_tensor(scaler) else scaler
        param.grad.mul_(factor)
