"""Gradient-norm clipping and the loss sanity check every training recipe runs."""

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn


class NonFiniteLossError(RuntimeError):
    """Raised when the training loss becomes NaN or infinite; ``step`` says where.

    Args:
        loss (float): the offending value.
        step (int): the global step at which it was seen.
    """

    def __init__(self, loss: float, step: int) -> None:
        self.loss = loss
        self.step = step
        super().__init__(
            f"The training loss is {loss} at step {step}; stopping so no checkpoint is written from diverged "
            "weights (the last saved checkpoint is intact). Common fixes: lower the learning rate, set "
            "`clip_grad_norm` (e.g. 1.0), train in bf16 or fp32 instead of fp16, and check the data for empty or "
            "fully masked samples."
        )


def check_loss_is_finite(loss: torch.Tensor | float, step: int) -> float:
    """Returns the loss as a float, or raises :class:`NonFiniteLossError` naming the step.

    Reading a tensor synchronises with the device: call it where the recipe reads the loss anyway (at logging
    steps), or every step if stopping at the first bad step matters more than throughput.

    Args:
        loss (torch.Tensor | float): the loss of the step.
        step (int): the global step, for the message.

    Returns:
        float: the loss value.

    Raises:
        NonFiniteLossError: if the loss is NaN or infinite.
    """
    value = float(loss.detach().item()) if torch.is_tensor(loss) else float(loss)
    if not math.isfinite(value):
        raise NonFiniteLossError(value, step)
    return value


class FiniteLossCheck:
    """Stops training at the first step whose loss is NaN or infinite, before the optimizer applies that step.

    Every step is checked, without making the device wait for the host: :meth:`record` is called after the
    step's last forward pass, before its backward, and queues a non-blocking copy of the step's loss to the host
    (and, distributed, one all-reduce per step); :meth:`check` is called once that backward is queued and waits for
    the copy only, i.e. for the forward pass, while the device works through the backward. On the CPU both are
    plain reads.

    Args:
        device (torch.device): where the loss lives.
        all_reduce (Callable | None): sums a tensor over ranks (distributed recipes), so that a non-finite loss
            on any rank stops every rank at the same step.
    """

    def __init__(self, device: torch.device, all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self._all_reduce = all_reduce
        on_cuda = device.type == "cuda"
        self._host = torch.zeros((), dtype=torch.float32, pin_memory=on_cuda)
        self._copied = torch.cuda.Event() if on_cuda else None

    def record(self, step_loss: torch.Tensor) -> None:
        """Queues the copy of ``step_loss`` (the step's loss so far) to the host."""
        value = step_loss.detach().float()
        if self._all_reduce is not None:
            value = self._all_reduce(value.clone())
        self._host.copy_(value, non_blocking=self._copied is not None)
        if self._copied is not None:
            self._copied.record()

    def check(self, step: int) -> None:
        """Raises :class:`NonFiniteLossError` if the last recorded loss is NaN or infinite.

        Args:
            step (int): the step being taken, for the message.
        """
        if self._copied is not None:
            self._copied.synchronize()
        value = float(self._host)
        if not math.isfinite(value):
            raise NonFiniteLossError(value, step)


def clip_grad_norm(
    parameters: nn.Module | Iterable[torch.Tensor], max_norm: float | None, norm_type: float = 2.0
) -> torch.Tensor:
    """Total gradient norm, clipping gradients to ``max_norm`` when it is set.

    Works for plain and FSDP-sharded (DTensor) gradients; the returned norm is a full (replicated) tensor on
    the gradients' device, not yet read on the host.

    Args:
        parameters (nn.Module | Iterable[torch.Tensor]): a model or its parameters.
        max_norm (float | None): clip threshold; ``None`` only measures the norm (for logging).
        norm_type (float): the p of the p-norm (``inf`` for the max norm).

    Returns:
        torch.Tensor: 0-d total norm of all gradients before clipping.

    Raises:
        ValueError: for a non-positive ``max_norm``.
    """
    if max_norm is not None and max_norm <= 0:
        raise ValueError(f"clip_grad_norm must be positive or null; received {max_norm}.")
    params = list(parameters.parameters() if isinstance(parameters, nn.Module) else parameters)
    groups = _group_by_mesh(params)
    if not groups:
        return torch.zeros(())
    total = _total_norm(groups, norm_type)
    if max_norm is not None:
        # clip with the norm as computed (a DTensor for sharded gradients) so it scales DTensor grads; one call
        # per mesh, as DTensor ops cannot mix meshes
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return total


def _group_by_mesh(params: list[torch.Tensor]) -> dict[object, list[torch.Tensor]]:
    # With FSDP + tensor parallelism, gradients live on two meshes (dp_shard x tp for split layers, dp_shard for
    # the rest); plain tensors share the key None.
    groups: dict[object, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            groups.setdefault(getattr(param.grad, "device_mesh", None), []).append(param)
    return groups


def _total_norm(groups: dict[object, list[torch.Tensor]], norm_type: float) -> torch.Tensor:
    if len(groups) == 1:
        (params,) = groups.values()
        return torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=norm_type)
    # DTensor cannot stack norms across meshes: each mesh's norm, then the norm of those (exact for any p-norm)
    norms = [torch.nn.utils.get_total_norm([p.grad for p in ps], norm_type=norm_type) for ps in groups.values()]
    norms = [norm.full_tensor() if hasattr(norm, "full_tensor") else norm for norm in norms]
    return torch.nn.utils.get_total_norm(norms, norm_type=norm_type)
