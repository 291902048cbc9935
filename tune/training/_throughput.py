"""Token counting, throughput and the progress bar of the training loop."""

import os
import sys
import time
from typing import Any, TextIO

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


def get_progress_bar(
    total: int, epoch: int, initial: int = 0, disable: bool | None = None, file: TextIO | None = None
) -> tqdm:
    """A tqdm bar for one epoch, shown on rank 0 only: a live bar on a terminal, one line per step in a log.

    Update it with ``bar.update(1)`` every step and ``bar.set_description(f"{epoch + 1}|{step}|Loss: {loss:.4f}")``
    (then ``bar.set_postfix(...)``, if any) at logging steps. On a terminal tqdm redraws the bar in place. When
    ``file`` is not a terminal (output redirected to a file or a pipe) the redraws would pile up in the log, so the
    bar writes one plain line per step instead, once the step's description is final: at ``set_postfix``, at the
    next ``update``, or at ``close``, e.g.
    ``1|12|Loss: 2.3456:  12% 12/100 [00:35<04:12,  2.91s/step, tokens_per_second=1234]``.

    Args:
        total (int): optimizer steps in the epoch.
        epoch (int): zero-based epoch index, shown 1-based.
        initial (int): steps already done (when resuming mid-epoch).
        disable (bool | None): hide the bar; default: hidden on ranks other than 0 and when the environment
            sets ``TQDM_DISABLE`` (tqdm's own switch) to a true value.
        file (TextIO | None): where the bar writes; default ``sys.stderr`` (read when called).

    Returns:
        tqdm: the bar.
    """
    if disable is None:
        disable = get_rank() != 0 or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
    file = sys.stderr if file is None else file
    options = dict(total=total, initial=initial, desc=f"{epoch + 1}|{initial}", disable=disable, unit="step")
    if _is_terminal(file):
        return tqdm(file=file, dynamic_ncols=True, **options)
    return _StepLines(lines_to=file, **options)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class _Discard:
    # tqdm's own drawing goes here; _StepLines writes its lines itself
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class _StepLines(tqdm):
    """A tqdm bar that writes one plain line per step to a file or pipe instead of redrawing itself.

    A terminal overwrites each redraw (carriage return); a log keeps them all (one per ``update`` and per
    ``set_description``/``set_postfix``). Here a step's line waits until its description is final: recipes call
    ``update(1)`` first, then ``set_description`` and ``set_postfix`` at logging steps. It is written by
    ``set_postfix``, by the next ``update``, or by ``close``, so each step gives exactly one line.
    """

    def __init__(self, *, lines_to: TextIO, **kwargs: Any) -> None:
        self._lines_to: TextIO | None = lines_to
        self._step_pending = False
        super().__init__(file=_Discard(), mininterval=0, miniters=1, **kwargs)

    def update(self, n: float = 1) -> bool | None:
        """Ends the previous step's line (writes it) and counts ``n`` more steps."""
        if self.disable:
            return None
        self._write_pending()
        shown = super().update(n)
        self._step_pending = True
        return shown

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """Sets the postfix and writes the current step's line (recipes set the postfix last)."""
        super().set_postfix(ordered_dict, refresh=refresh, **kwargs)
        self._write_pending()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """As :meth:`set_postfix`, with the postfix as one string."""
        super().set_postfix_str(s, refresh=refresh)
        self._write_pending()

    def close(self) -> None:
        """Writes the last step's line, if not written yet, and closes the bar."""
        if not self.disable:
            self._write_pending()
        super().close()

    def _write_pending(self) -> None:
        if not self._step_pending or self.disable:
            return
        self._step_pending = False
        if self._lines_to is None:
            return
        try:
            self._lines_to.write(self._line() + "\n")
            self._lines_to.flush()
        except (OSError, ValueError):  # a closed or broken stream: stop writing, never stop training
            self._lines_to = None

    def _line(self) -> str:
        desc = (self.desc or "").removesuffix(": ")
        stats = self.format_dict
        if not self.total:
            return self.format_meter(**{**stats, "prefix": desc, "ncols": None})
        layout = "{desc}{percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
        prefix = f"{desc}: " if desc else ""
        return self.format_meter(**{**stats, "prefix": prefix, "ncols": None, "bar_format": layout})
