"""Cross-entropy losses that never hold full fp32 ``[tokens, vocab]`` logits at once.

By default both losses return the MEAN over non-ignored labels, as torchtune's ``CEWithChunkedOutputLoss`` does,
so a loop written for torchtune computes the same number. ``reduction="sum"`` returns the sum of per-token losses
instead: tune's recipes ask for it (through ``tune.training.prepare_loss``) because a training step normalises by
the token count of the whole step (every micro-batch, every rank), which one micro-batch's loss cannot know. See
``tune.training.num_loss_tokens``.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from tune.modules._tied_linear import TiedLinear

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


def _fused_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int,
    all_valid: bool,
    grad_hidden: torch.Tensor | None,
    grad_weight: torch.Tensor | None,
    need_weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Loss sum of one chunk, writing d(loss)/d(hidden) into ``grad_hidden`` and adding d(loss)/d(weight).

    hidden [n, d], weight [v, d], labels [n]. Returns the chunk's loss sum and the running weight gradient (the
    first chunk allocates it with its own product, later chunks accumulate into it).
    """
    logits = torch.mm(hidden, weight.t())  # [n, v] in the model dtype, as the output layer computes it
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    del logits
    if all_valid:  # ignored rows were dropped before the call: no masking passes
        targets, valid = labels[:, None], None
        loss = -log_probs.gather(1, targets).sum()
    else:
        valid = labels != ignore_index
        targets = torch.where(valid, labels, 0)[:, None]  # ignored rows point at class 0, then get zeroed
        loss = -(log_probs.gather(1, targets).squeeze(1) * valid).sum()
    if grad_hidden is None and not need_weight_grad:
        return loss, grad_weight
    # d(sum of -log p_target)/d(logits) = softmax - one_hot(target), zero on ignored rows; built in place
    grad_logits = log_probs.exp_()
    minus_one = (
        torch.full_like(targets, -1, dtype=grad_logits.dtype)
        if valid is None
        else -valid[:, None].to(grad_logits.dtype)
    )
    grad_logits.scatter_add_(1, targets, minus_one)
    if valid is not None:
        grad_logits.mul_(valid[:, None])
    grad_logits = grad_logits.to(weight.dtype)
    if grad_hidden is not None:
        torch.mm(grad_logits, weight, out=grad_hidden)
    if need_weight_grad:
        if grad_weight is None:
            grad_weight = torch.mm(grad_logits.t(), hidden)
        else:
            grad_weight.addmm_(grad_logits.t(), hidden)
    return loss, grad_weight


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``hidden @ weight.T`` whose gradients are computed during the forward pass.

    Each chunk's logits exist only while that chunk is processed: the forward pass turns them into the softmax
    gradient right away and multiplies it into the gradients of ``hidden`` and ``weight``, which are kept for
    backward (the memory autograd would hold for them anyway). Backward only scales those by the incoming
    gradient, so nothing is recomputed: one output-projection matmul fewer per chunk than checkpointing, and no
    ``[tokens, vocab]`` buffers besides the chunk's own. Single use: a second backward through the same graph
    raises an error instead of returning rescaled gradients.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index, num_chunks, all_valid):  # noqa: D102 (class docstring)
        need_hidden_grad, need_weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden_grad else None
        grad_chunks = grad_hidden.tensor_split(num_chunks) if need_hidden_grad else [None] * num_chunks
        grad_weight = None
        total = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        chunks = zip(hidden.tensor_split(num_chunks), labels.tensor_split(num_chunks), grad_chunks)
        for hidden_chunk, label_chunk, grad_chunk in chunks:
            if hidden_chunk.shape[0] == 0:
                continue
            loss, grad_weight = _fused_chunk(
                hidden_chunk, weight, label_chunk, ignore_index, all_valid, grad_chunk, grad_weight, need_weight_grad
            )
            total += loss
        if need_weight_grad and grad_weight is None:  # no tokens at all: a zero gradient
            grad_weight = torch.zeros_like(weight)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total):  # noqa: D102
        if getattr(ctx, "consumed", False):
            raise RuntimeError(
                "LinearCrossEntropyLoss computed its gradients once, in forward, and already handed them out: it "
                "cannot be backpropagated through twice (retain_graph=True). Call the loss again for a second "
                "backward."
            )
        ctx.consumed = True
        grad_hidden, grad_weight = ctx.saved_tensors
        # scaled in place: the buffers were made for this one backward
        if grad_hidden is not None:
            grad_hidden = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_total.to(grad_weight.dtype))
        return grad_hidden, grad_weight, None, None, None, None


def _plain_weight(projection) -> torch.Tensor | None:
    """The weight of a projection that is exactly ``x @ weight.T``, or None when it computes anything else."""
    if isinstance(projection, torch.Tensor):
        weight = projection
    elif type(projection) is nn.Linear and projection.bias is None:  # not subclasses: they may change forward
        weight = projection.weight
    elif type(projection) is TiedLinear and projection.softcapping is None:
        weight = projection.weight
    else:
        return None
    if isinstance(projection, nn.Module) and (projection._forward_hooks or projection._forward_pre_hooks):
        return None  # hooks (FSDP unsharding, a user's hook) must see the module called
    if type(weight) not in (torch.Tensor, nn.Parameter):  # DTensor, NF4 and other subclasses
        return None
    return weight


class LinearCrossEntropyLoss(nn.Module):
    """Output projection fused with cross-entropy, one chunk of tokens at a time.

    The model runs with ``skip_output_layer=True`` and returns its final hidden states ``[b, s, d]``; this loss
    applies the output projection to one chunk of tokens, upcasts that chunk's logits to fp32, scores them and
    drops them: at no point do full ``[tokens, vocab]`` logits exist, in any dtype.

    When the projection is a plain weight (``nn.Linear`` without bias, an untied or tied embedding matrix without
    soft-capping), the gradients of each chunk are computed right after its loss, in the forward pass, and
    backward only scales them: no logits are recomputed. Any other projection (a LoRA output layer, a sharded
    or quantised weight, a module with hooks, or a compiled chunk loss from ``tune.training.compile_loss``) runs
    each chunk under non-reentrant activation checkpointing instead, so backward recomputes the chunk's logits
    (one extra output matmul per chunk).

    Args:
        num_output_chunks (int): the most token chunks. More chunks, lower peak memory; chunks are never smaller
            than ``min_chunk_mib`` of fp32 logits, so a small vocabulary gets fewer, larger chunks.
        ignore_index (int): label value that contributes no loss.
        reduction (str): ``"mean"`` (default) over the non-ignored tokens of this call, or ``"sum"`` of the token
            losses (what tune's recipes ask for: they normalise over the whole step).
        mask_ignored_tokens (bool | None): drop positions labelled ``ignore_index`` before the projection, so
            padding and masked prompts cost no vocab matmul. Selecting them is a data-dependent shape, which
            forces a host-device sync on an accelerator; ``None`` (default) masks on CPU, where there is no such
            sync, and not elsewhere. The loss value is the same either way.
        min_chunk_mib (float): the smallest chunk, in MiB of fp32 logits (``rows x vocab x 4`` bytes), for a plain
            projection weight. Below a few hundred rows the vocab matmul runs well under the machine's matmul rate
            (measured in benchmarks/README.md, "Where the time goes"). Default 32.

    Raises:
        ValueError: for a non-positive ``num_output_chunks`` or an unknown ``reduction``.

    Example:
        >>> loss_fn = LinearCrossEntropyLoss()
        >>> loss_fn.set_model_output(model)  # sets model.skip_output_layer = True
        >>> hidden = model(tokens)  # [b, s, d]
        >>> loss = loss_fn(hidden, shift_labels(labels))  # mean over the scored tokens
    """

    def __init__(
        self,
        num_output_chunks: int = 8,
        ignore_index: int = -100,
        reduction: str = "mean",
        mask_ignored_tokens: bool | None = None,
        min_chunk_mib: float = 32.0,
    ) -> None:
        super().__init__()
        _check_args(num_output_chunks, reduction)
        if min_chunk_mib < 0:
            raise ValueError(f"min_chunk_mib must be >= 0, got {min_chunk_mib}.")
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.mask_ignored_tokens = mask_ignored_tokens
        self.min_chunk_mib = min_chunk_mib
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
        source = self.linear_projection if output is None else output
        weight = _plain_weight(source) if "_chunk_loss" not in self.__dict__ else None  # not when compiled
        if weight is not None and torch.is_grad_enabled() and (flat_hidden.requires_grad or weight.requires_grad):
            all_valid = self._should_mask(hidden.device)  # then the ignored rows are gone already
            num_chunks = self._num_chunks(flat_hidden.shape[0], weight.shape[0])
            total = _FusedLinearCrossEntropy.apply(
                flat_hidden, weight, flat_labels, self.ignore_index, num_chunks, all_valid
            )
            return _reduce(total, labels, self.ignore_index, self.reduction)
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

    def _num_chunks(self, num_tokens: int, vocab_size: int) -> int:
        min_rows = max(1, int(self.min_chunk_mib * 1024**2) // (4 * vocab_size))
        return max(1, min(self.num_output_chunks, -(-num_tokens // min_rows)))

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
        reduction (str): ``"mean"`` (default, torchtune's meaning) over the non-ignored tokens of this call, or
            ``"sum"`` of the token losses.

    Raises:
        ValueError: for a non-positive ``num_output_chunks`` or an unknown ``reduction``.
    """

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100, reduction: str = "mean") -> None:
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
            total = total + self.compute_cross_entropy(flat_chunk, label_chunk.reshape(-1))
        return _reduce(total, labels, self.ignore_index, self.reduction)

    def compute_cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """The summed cross-entropy of one chunk, upcast to fp32; the unit to ``torch.compile`` on its own.

        Args:
            logits (torch.Tensor): ``[n, vocab]`` logits of one chunk.
            labels (torch.Tensor): ``[n]`` shifted labels of that chunk.
            normalize (bool): accepted for torchtune compatibility and unused: the chunk's loss is always a sum,
                the reduction is applied once over all chunks in :meth:`forward`.

        Returns:
            torch.Tensor: scalar sum of the chunk's token losses.
        """
        return _chunk_ce_sum(logits, labels, self.ignore_index)
