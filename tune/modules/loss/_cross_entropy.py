"""Cross-entropy losses that never hold full fp32 ``[tokens, vocab]`` logits at once.

Both losses return the SUM of per-token losses over non-ignored labels. Dividing by the number of loss tokens is
left to the caller on purpose: a training step normalises by the token count of the whole step (every
micro-batch, every rank), which one micro-batch's loss cannot know. See ``tune.training.num_loss_tokens``.
"""

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_REDUCTIONS = ("sum", "mean")


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Aligns labels with the positions that predict them: position ``i`` is scored against ``labels[i + 1]``.

    Batches carry labels aligned with ``tokens`` (not pre-shifted). The last position predicts nothing, so it
    gets ``ignore_index``; the result keeps the ``[b, s]`` shape so it lines up with the model output.

    Args:
        labels (torch.Tensor): ``[b, s]`` labels aligned with the input tokens.
        ignore_index (int): the label value that contributes no loss.

    Returns:
        torch.Tensor: ``[b, s]`` shifted labels.

    Raises:
        ValueError: if ``labels`` is not 2-D.
    """
    if labels.dim() != 2:
        raise ValueError(f"labels must be [batch, seq_len]; received shape {tuple(labels.shape)}.")
    pad = labels.new_full((labels.shape[0], 1), ignore_index)
    return torch.cat([labels[:, 1:], pad], dim=1)


def _check_args(num_output_chunks: int, reduction: str) -> None:
    if not isinstance(num_output_chunks, int) or num_output_chunks < 1:
        raise ValueError(f"num_output_chunks must be a positive int; received {num_output_chunks!r}.")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}; received {reduction!r}.")


def _reduce(total: torch.Tensor, labels: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return total
    # mean over scored tokens; clamp so a batch of only ignored labels gives 0 instead of nan
    return total / (labels != ignore_index).sum().clamp(min=1)


def _chunk_ce_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    # logits [n, v] in the model dtype; the upcast (to fp32, or kept at fp64) lives only for this chunk
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


class LinearCrossEntropyLoss(nn.Module):
    """Output projection fused with cross-entropy, one chunk of tokens at a time.

    The model runs with ``skip_output_layer=True`` and returns its final hidden states ``[b, s, d]``; this loss
    applies the output projection to one chunk of tokens, upcasts that chunk's logits to fp32, scores them and
    drops them. Each chunk runs under non-reentrant activation checkpointing, so backward recomputes the chunk's
    logits instead of keeping them: at no point do full ``[tokens, vocab]`` logits exist, in any dtype. The price
    is one extra output matmul per chunk in backward.

    Args:
        num_output_chunks (int): number of token chunks. More chunks, lower peak memory.
        ignore_index (int): label value that contributes no loss.
        reduction (str): ``"sum"`` (default; the training recipes normalise over the whole step) or ``"mean"``
            over the non-ignored tokens of this call.
        mask_ignored_tokens (bool | None): drop positions labelled ``ignore_index`` before the projection, so
            padding and masked prompts cost no vocab matmul. Selecting them is a data-dependent shape, which
            forces a host-device sync on an accelerator; ``None`` (default) masks on CPU, where there is no such
            sync, and not elsewhere. The loss value is the same either way.

    Raises:
        ValueError: for a non-positive ``num_output_chunks`` or an unknown ``reduction``.

    Example:
        >>> loss_fn = LinearCrossEntropyLoss()
        >>> loss_fn.set_model_output(model)  # sets model.skip_output_layer = True
        >>> hidden = model(tokens)  # [b, s, d]
        >>> loss_sum = loss_fn(hidden, shift_labels(labels))
    """

    def __init__(
        self,
        num_output_chunks: int = 8,
        ignore_index: int = -100,
        reduction: str = "sum",
        mask_ignored_tokens: bool | None = None,
    ) -> None:
        super().__init__()
        _check_args(num_output_chunks, reduction)
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.mask_ignored_tokens = mask_ignored_tokens
        self.linear_projection: Callable[[torch.Tensor], torch.Tensor] | None = None

    def set_model_output(self, model: nn.Module) -> None:
        """Uses ``model.output`` as the projection and makes the model return hidden states.

        Args:
            model (nn.Module): a decoder with an ``output`` module (``nn.Linear``, a LoRA linear, or a tied
                embedding projection) and a ``skip_output_layer`` flag.

        Raises:
            ValueError: if the model has no ``output`` attribute.
        """
        if not hasattr(model, "output"):
            raise ValueError(
                f"{type(model).__name__} has no `output` module to project hidden states with. "
                "LinearCrossEntropyLoss needs a decoder exposing `output`; use CEWithChunkedOutputLoss on logits."
            )
        # a plain attribute, not a registered submodule: the model keeps owning its parameters
        object.__setattr__(self, "linear_projection", model.output)
        model.skip_output_layer = True

    def forward(
        self,
        hidden: torch.Tensor,
        labels: torch.Tensor,
        output: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores hidden states against shifted labels.

        Args:
            hidden (torch.Tensor): ``[b, s, d]`` final hidden states.
            labels (torch.Tensor): ``[b, s]`` labels already shifted (see :func:`shift_labels`).
            output (Callable | torch.Tensor | None): the projection, as a module/callable or a ``[vocab, d]``
                weight; ``None`` uses the one given to :meth:`set_model_output`.

        Returns:
            torch.Tensor: scalar loss, fp32 (fp64 for fp64 inputs), summed or averaged per ``reduction``.

        Raises:
            ValueError: if no projection is known or the shapes do not line up.
        """
        projection = self._projection(output)
        if hidden.shape[:-1] != labels.shape:
            raise ValueError(
                f"hidden states {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree on [batch, seq]."
            )
        flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # [b*s, d]
        flat_labels = labels.reshape(-1)  # [b*s]
        if self._should_mask(hidden.device):
            # padding and prompt tokens never reach the vocab projection (boolean indexing syncs on accelerators)
            keep = flat_labels != self.ignore_index
            flat_hidden, flat_labels = flat_hidden[keep], flat_labels[keep]
        # an empty sum keeps the result attached to the graph when every label is ignored: backward gives zeros
        total = flat_hidden[:0].sum().to(torch.promote_types(hidden.dtype, torch.float32))
        chunks = zip(flat_hidden.tensor_split(self.num_output_chunks), flat_labels.tensor_split(self.num_output_chunks))
        for hidden_chunk, label_chunk in chunks:
            if hidden_chunk.shape[0] == 0:
                continue
            if torch.is_grad_enabled():
                total = total + checkpoint(self._chunk_loss, projection, hidden_chunk, label_chunk, use_reentrant=False)
            else:
                total = total + self._chunk_loss(projection, hidden_chunk, label_chunk)
        return _reduce(total, labels, self.ignore_index, self.reduction)

    def _should_mask(self, device: torch.device) -> bool:
        if self.mask_ignored_tokens is None:
            return device.type == "cpu"
        return self.mask_ignored_tokens

    def _projection(self, output) -> Callable[[torch.Tensor], torch.Tensor]:
        output = self.linear_projection if output is None else output
        if output is None:
            raise ValueError(
                "LinearCrossEntropyLoss has no output projection: call `loss_fn.set_model_output(model)` once "
                "after building the model, or pass `output=model.output` to the call."
            )
        if isinstance(output, torch.Tensor):
            weight = output
            return lambda x: F.linear(x, weight)
        return output

    def _chunk_loss(self, projection, hidden_chunk: torch.Tensor, label_chunk: torch.Tensor) -> torch.Tensor:
        logits = projection(hidden_chunk)  # [n_chunk, vocab], model dtype
        if hasattr(logits, "full_tensor"):  # a DTensor from a tensor-parallel output layer
            logits = logits.full_tensor()
        return _chunk_ce_sum(logits, label_chunk, self.ignore_index)


class CEWithChunkedOutputLoss(nn.Module):
    """Cross-entropy on logits, upcast to fp32 one chunk of the sequence at a time.

    For models that return logits. A bf16 model's ``[b, s, vocab]`` logits are never copied to fp32 as a whole:
    each chunk is upcast, scored and summed. Accepts the logits as one tensor or as a list of sequence chunks
    (the torchtune convention), with labels already shifted.

    Args:
        num_output_chunks (int): number of sequence chunks.
        ignore_index (int): label value that contributes no loss.
        reduction (str): ``"sum"`` (default) or ``"mean"`` over the non-ignored tokens of this call.

    Raises:
        ValueError: for a non-positive ``num_output_chunks`` or an unknown ``reduction``.
    """

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100, reduction: str = "sum") -> None:
        super().__init__()
        _check_args(num_output_chunks, reduction)
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: torch.Tensor | list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """Scores logits against shifted labels.

        Args:
            logits (torch.Tensor | list[torch.Tensor]): ``[b, s, vocab]``, or a list of ``[b, s_i, vocab]`` chunks
                along the sequence.
            labels (torch.Tensor): ``[b, s]`` labels already shifted (see :func:`shift_labels`).

        Returns:
            torch.Tensor: scalar loss, fp32 (fp64 for fp64 inputs), summed or averaged per ``reduction``.

        Raises:
            ValueError: if the logits do not cover the labels' sequence length.
        """
        chunks = list(logits) if isinstance(logits, (list, tuple)) else logits.tensor_split(self.num_output_chunks, 1)
        seq_len = sum(chunk.shape[1] for chunk in chunks)
        if seq_len != labels.shape[1]:
            raise ValueError(f"logits cover {seq_len} positions but labels have {labels.shape[1]}.")
        label_chunks = labels.split([chunk.shape[1] for chunk in chunks], dim=1)
        total = chunks[0].new_zeros((), dtype=torch.promote_types(chunks[0].dtype, torch.float32))
        for chunk, label_chunk in zip(chunks, label_chunks):
            flat_chunk = chunk.reshape(-1, chunk.shape[-1])  # [b * s_i, vocab]
            total = total + _chunk_ce_sum(flat_chunk, label_chunk.reshape(-1), self.ignore_index)
        return _reduce(total, labels, self.ignore_index, self.reduction)
