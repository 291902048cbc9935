"""Token counting, throughput and the progress bar of the training loop."""

import os
import time

import torch
from tqdm import tqdm

from tune.utils import get_rank


def count_tokens(tokens: torch.Tensor, pad_id: int | None = None) -> torch.Tensor:
    """Number of non-padding tokens, as a 0-d int64 tensor on the tokens' device (no host sync).

    Throughput counts these: padding costs compute but is not training data. Packed batches pad only at the
    end of each pack, so they count almost every position.

    Args:
        tokens (torch.Tensor): ``[b, s]`` token ids.
        pad_id (int | None): the padding id; ``None`` counts every position.

    Returns:
        torch.Tensor: the count.
    """
    if pad_id is None:
        return torch.tensor(tokens.numel(), device=tokens.device)
    return (tokens != pad_id).sum()


class ThroughputTracker:
    """Tokens per second between logging steps, accumulated on the device without syncing.

    Call :meth:`update` every step with :func:`count_tokens` of the batch, and :meth:`compute` at logging steps:
    it reads the count (one sync), divides by the wall time since the last compute, and starts a new window.
    """

    def __init__(self) -> None:
        self._tokens: torch.Tensor | int = 0
        self._start = time.perf_counter()

    def reset(self) -> None:
        """Starts a new window now (e.g. after an evaluation or a checkpoint save that should not count)."""
        self._tokens = 0
        self._start = time.perf_counter()

    def update(self, num_tokens: torch.Tensor | int) -> None:
        """Adds tokens processed in this window.

        Args:
            num_tokens (torch.Tensor | int): token count of a micro-batch or step.
        """
        self._tokens = self._tokens + num_tokens

    def compute(self) -> dict[str, float]:
        """Reads the window and resets it.

        Returns:
            dict[str, float]: ``tokens_per_second`` and ``num_tokens`` of the window.
        """
        tokens = int(self._tokens.item() if torch.is_tensor(self._tokens) else self._tokens)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self.reset()
        return {"tokens_per_second": tokens / elapsed, "num_tokens": float(tokens)}


def get_progress_bar(total: int, epoch: int, initial: int = 0, disable: bool | None = None) -> tqdm:
    """A tqdm bar for one epoch, shown on rank 0 only.

    Update it with ``bar.update(1)`` and ``bar.set_description(f"{epoch + 1}|{step}|Loss: {loss:.4f}")`` at
    logging steps.

    Args:
        total (int): optimizer steps in the epoch.
        epoch (int): zero-based epoch index, shown 1-based.
        initial (int): steps already done (when resuming mid-epoch).
        disable (bool | None): hide the bar; default: hidden on ranks other than 0 and when the environment
            sets ``TQDM_DISABLE`` (tqdm's own switch) to a true value.

    Returns:
        tqdm: the bar.
    """
    if disable is None:
        disable = get_rank() != 0 or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
    return tqdm(total=total, initial=initial, desc=f"{epoch + 1}|{initial}", disable=disable, dynamic_ncols=True)
