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

:class:`LossTokenCounter` applies way 1 and also keeps the counts, so that an epoch (or a run, before its first
save) without a single loss token stops with :class:`NoLossTokensError` instead of saving the untrained model.
"""

from collections.abc import Iterable

import torch
from torch import nn

from tune.training._distributed import all_reduce_sum
from tune.utils import TuneError, get_world_size


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
    return _scale(all_reduce_sum(torch.as_tensor(num_tokens).to(torch.float32)), world_size)


def _scale(total: torch.Tensor, world_size: int | None) -> torch.Tensor:
    world_size = get_world_size() if world_size is None else world_size
    return world_size / total.to(torch.float32).clamp(min=1.0)


class NoLossTokensError(TuneError):
    """Raised when an epoch, or a run before its first save, had no token to compute the loss on.

    Every label was ignored (``-100``): the loss and the gradients were 0 at every step and the weights never
    changed, so saving them as a trained checkpoint would hide the problem.

    Args:
        what (str): the span without loss tokens, e.g. ``"epoch 1 (3 steps)"``.
        max_seq_len (int | None): the tokenizer's truncation length, named in the fix when set.
    """

    def __init__(self, what: str, max_seq_len: int | None = None) -> None:
        self.what = what
        self.max_seq_len = max_seq_len
        if max_seq_len is not None:
            cause = (
                f"the samples are most likely cut off before their answer by truncation to max_seq_len={max_seq_len}. "
                "Raise tokenizer.max_seq_len (or the dataset's max_seq_len) above the prompts' length, or set "
                "dataset.train_on_input=True to train on the prompts too"
            )
        else:
            cause = (
                "the dataset masks every token. Check dataset.train_on_input and that the samples have a non-empty "
                "answer"
            )
        super().__init__(
            f"{what} has no token to learn from: every label is masked (-100), so the loss and the gradients are "
            f"0 and the weights never change; {cause}. No checkpoint is written for it."
        )

    def __reduce__(self):  # pickled unchanged (an error shared between ranks keeps its message)
        return type(self), (self.what, self.max_seq_len)


class LossTokenCounter:
    """Scales each step's summed loss by its loss tokens (:func:`step_loss_scale`) and keeps the counts.

    A recipe calls :meth:`step_loss_scale` once per optimizer step with the step's token count, in place of
    :func:`step_loss_scale`, and :meth:`check` before every save. The counts stay tensors on the count's device
    (summed over ranks by the collective :func:`step_loss_scale` makes anyway): :meth:`check` reads them, at a
    save, where the recipe synchronises with the device anyway. A step without loss tokens is fine (a batch of
    prompts whose answers were all cut, say); an epoch without any is an error, and so is a save before the run
    has seen any.

    Args:
        max_seq_len (int | None): the tokenizer's ``max_seq_len``, named in the error (truncation is the usual
            cause). Default None.
    """

    def __init__(self, max_seq_len: int | None = None) -> None:
        self._max_seq_len = max_seq_len
        self._epoch: torch.Tensor | None = None  # tokens since the epoch began, all ranks
        self._run: torch.Tensor | None = None  # tokens since this process began, all ranks
        self._steps_in_epoch = 0
        self._steps_in_run = 0

    def step_loss_scale(
        self,
        num_tokens: torch.Tensor | int,
        world_size: int | None = None,
        *,
        num_loss_tokens: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """:func:`step_loss_scale`, counting the step's loss tokens (summed over ranks) towards the epoch and the run.

        Args:
            num_tokens (torch.Tensor | int): this rank's loss tokens for the whole step (all micro-batches), or
                whatever else the loss is averaged over (preference pairs for DPO); on the GPU under NCCL.
            world_size (int | None): data-parallel ranks; default: the process group's.
            num_loss_tokens (torch.Tensor | int | None): the step's loss tokens when ``num_tokens`` counts something
                else (pairs); summed over ranks in the same collective. Default: ``num_tokens``.

        Returns:
            torch.Tensor: 0-d fp32 factor ``world_size / max(num_tokens on all ranks, 1)``.
        """
        count = torch.as_tensor(num_tokens).to(torch.float32)
        if num_loss_tokens is None:
            total = all_reduce_sum(count)
            tokens = total
        else:  # one collective for both counts
            both = all_reduce_sum(torch.stack([count, torch.as_tensor(num_loss_tokens).to(count)]))
            total, tokens = both[0], both[1]
        if self._epoch is None or self._run is None:
            self._epoch, self._run = torch.zeros_like(tokens), torch.zeros_like(tokens)
        self._epoch += tokens
        self._run += tokens
        self._steps_in_epoch += 1
        self._steps_in_run += 1
        return _scale(total, world_size)

    def check(self, epoch: int, end_of_epoch: bool) -> None:
        """Raises :class:`NoLossTokensError` when the epoch (at its end) or the run so far had no loss token.

        Call it on every rank right before a save; at the end of an epoch it also starts the next epoch's count.
        Reads the counts (a host-device sync): call it where the recipe saves anyway.

        Args:
            epoch (int): the 0-based epoch, for the message.
            end_of_epoch (bool): whether this step ends the epoch.

        Raises:
            NoLossTokensError: when no step of the epoch (at its end) or of the run (at any save) had a loss token.
        """
        if self._epoch is None or self._run is None:  # no step yet
            return
        if end_of_epoch and self._epoch.item() == 0:
            raise NoLossTokensError(f"Epoch {epoch + 1} ({self._steps_in_epoch} steps)", self._max_seq_len)
        if self._run.item() == 0:
            raise NoLossTokensError(f"The run ({self._steps_in_run} steps so far)", self._max_seq_len)
        if end_of_epoch:
            self._epoch.zero_()
            self._steps_in_epoch = 0


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
