"""Log-probabilities of sequences under a language model, and the trimming of generated sequences.

Shapes: ``b`` sequences, ``s`` positions, ``v`` vocabulary entries. Labels follow the data convention of
``tune.data``: aligned with the tokens (not shifted), ``-100`` where no log-probability is taken.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules import TiedLinear

if TYPE_CHECKING:
    from tune.training import ContextParallel

# completion positions projected onto the vocabulary at once: 2,048 x a 128k vocabulary is 1 GiB of fp32 logits
COMPLETION_CHUNK_SIZE = 2048


def truncate_sequence_at_first_stop_token(
    sequences: torch.Tensor, stop_tokens: torch.Tensor, fill_value: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces every token after the first stop token of each row with ``fill_value``, in place.

    The first stop token itself is kept. A row without a stop token is left as it is.

    Args:
        sequences (torch.Tensor): token ids ``[b, s]``; changed in place.
        stop_tokens (torch.Tensor): the ids that end a sequence (e.g. EOS and end-of-turn).
        fill_value (int): what replaces the tokens after the stop, usually the pad id. Default 0.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``(padding_mask, sequences)``, both ``[b, s]``: ``padding_mask`` is True
        on the replaced positions; ``sequences`` is the input tensor, truncated.

    Example:
        >>> seqs = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
        >>> mask, seqs = truncate_sequence_at_first_stop_token(seqs, torch.tensor([2]))
        >>> seqs
        tensor([[5, 2, 0, 0],
                [5, 6, 7, 8]])
    """
    is_stop = torch.isin(sequences, stop_tokens)
    # stops at or before each position; a position is past the first stop when one came strictly before it
    stops_so_far = is_stop.cumsum(dim=-1)
    padding_mask = (stops_so_far - is_stop.long()) > 0
    sequences[padding_mask] = fill_value
    return padding_mask, sequences


def logits_to_logprobs(logits: torch.Tensor, sequences: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The log-probability of each token of ``sequences`` under the distributions ``softmax(logits / temperature)``.

    ``logits[:, t]`` must be the distribution ``sequences[:, t]`` was drawn from (already shifted by the caller).

    Args:
        logits (torch.Tensor): ``[b, s, v]``.
        sequences (torch.Tensor): token ids ``[b, s]``.
        temperature (float): divides the logits first. Default 1.0.

    Returns:
        torch.Tensor: ``[b, s]`` log-probabilities, in the logits' dtype.
    """
    log_probs = F.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(dim=-1, index=sequences.unsqueeze(-1)).squeeze(-1)


def get_batch_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_pad_token_id: int = CROSS_ENTROPY_IGNORE_IDX,
    return_average_logprobs: bool = False,
) -> torch.Tensor:
    """Log-probability of each row's labelled tokens: the sum (or mean) of ``log p(labels[t] | tokens[:t])``.

    This is the sequence log-probability of preference losses: with the prompt masked (``-100``), it covers the
    completion tokens only. Position ``t`` of ``logits`` predicts label ``t + 1``, so the first label and the last
    logits are not used. Computed in float32 (at least), one row at a time, without a ``[b, s, v]`` log-softmax.

    Args:
        logits (torch.Tensor): the model's output for the tokens, ``[b, s, v]``.
        labels (torch.Tensor): ``[b, s]``, aligned with the tokens (not shifted); ``label_pad_token_id`` where no
            log-probability is taken.
        label_pad_token_id (int): the ignored label. Default -100.
        return_average_logprobs (bool): the mean over the labelled tokens instead of the sum (0 for a row
            without any), as IPO and SimPO use. Default False.

    Returns:
        torch.Tensor: ``[b]`` float32 (float64 for float64 logits) log-probabilities.

    Raises:
        ValueError: when ``logits`` is not ``[*labels.shape, v]``.
    """
    if logits.dim() != 3 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"get_batch_log_probs needs logits [b, s, v] and labels [b, s] with the same b and s; got logits "
            f"{tuple(logits.shape)} and labels {tuple(labels.shape)}."
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    targets = labels[:, 1:]
    # cross-entropy per token is -log p(target): 0 at ignored positions, and no [b, s, v] log-softmax is kept
    per_token = torch.stack(
        [
            -F.cross_entropy(row.to(dtype), target, ignore_index=label_pad_token_id, reduction="none")
            for row, target in zip(logits[:, :-1], targets)
        ]
    )  # [b, s - 1]
    summed = per_token.sum(dim=-1)
    if not return_average_logprobs:
        return summed
    num_tokens = (targets != label_pad_token_id).sum(dim=-1)
    return summed / num_tokens.clamp(min=1)


class SequenceLogProbs(NamedTuple):
    """The log-probabilities of a batch's completions, and what the logits metrics need of them.

    Attributes:
        log_probs (torch.Tensor): ``[b]`` float32 summed (or averaged) log-probabilities of each row's labelled
            tokens, attached to the graph when the model's output is.
        logit_sums (torch.Tensor): ``[b]`` float32, detached: the sum over the row's labelled positions of the
            logits averaged over the vocabulary (what ``PreferenceMetrics`` turns into ``logits/chosen``).
        num_tokens (torch.Tensor): ``[b]`` int64 number of labelled tokens of each row.
        nll_sums (torch.Tensor | None): ``[b]`` float32, with ``nll_labels`` only: the summed negative
            log-likelihood of each row's tokens labelled in ``nll_labels`` (ORPO's chosen sequences), attached to the
            graph. Default None.
        nll_tokens (torch.Tensor | None): ``[b]`` int64 number of those tokens. Default None.
    """

    log_probs: torch.Tensor
    logit_sums: torch.Tensor
    num_tokens: torch.Tensor
    nll_sums: torch.Tensor | None = None
    nll_tokens: torch.Tensor | None = None


def chosen_nll_labels(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
    seq_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The labels of ORPO's NLL term for a preference batch: every token of each chosen sequence, prompt included.

    A preference batch holds the chosen rows, then the rejected rows (``tune.data.padded_collate_dpo``), padded on
    the right, with labels on the completions only. A chosen row's sequence runs from its first token to its last
    labelled one (the padding comes after it): those positions are labelled with their tokens, as TRL's ORPO
    trainer scores every non-padding token of the chosen sequence. The rejected rows get no label. A row whose
    completion was cut away entirely has no label either.

    A padding-free row (``tune.data.padding_free_collate_dpo``, with ``seq_lens``) gets the same labels sequence
    by sequence, each sequence's first position left unlabelled (the padded rows' first label is never used
    either, and here it would be predicted by the previous sequence's last token).

    Args:
        tokens (torch.Tensor): ``[2b, s]`` token ids, chosen rows first; or ``[1, T]`` with ``seq_lens``.
        labels (torch.Tensor): the same shape, not shifted; ``ignore_index`` outside the completions.
        ignore_index (int): the ignored label. Default -100.
        seq_lens (torch.Tensor | None): ``[2b]`` the sequences' lengths in a padding-free row, chosen first.
            Default None (padded rows).

    Returns:
        torch.Tensor: labels of the shape of ``labels`` (not shifted), on the labels' device.
    """
    if seq_lens is not None:
        return _packed_chosen_nll_labels(tokens, labels, ignore_index, seq_lens.to(labels.device))
    num_rows, seq_len = labels.shape
    positions = torch.arange(seq_len, device=labels.device)
    # the last labelled position of each row (-1 without any)
    last = torch.where(labels != ignore_index, positions, -1).amax(dim=-1, keepdim=True)
    in_sequence = positions <= last  # [2b, s]
    in_sequence[num_rows // 2 :] = False  # rejected rows
    return torch.where(in_sequence, tokens.to(labels.device), ignore_index)


def _packed_chosen_nll_labels(
    tokens: torch.Tensor, labels: torch.Tensor, ignore_index: int, seq_lens: torch.Tensor
) -> torch.Tensor:
    # [T]: each position's sequence, and whether it is a chosen one (the first half of the sequences)
    # output_size: no host-device synchronisation to find the length
    segment = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=labels.device), seq_lens, output_size=labels.shape[-1]
    )
    positions = torch.arange(labels.shape[-1], device=labels.device)
    labelled = torch.where(labels[0] != ignore_index, positions, -1)
    last = torch.full_like(seq_lens, -1).scatter_reduce(0, segment, labelled, reduce="amax")  # per sequence
    starts = seq_lens.cumsum(0) - seq_lens
    in_sequence = (positions > starts[segment]) & (positions <= last[segment]) & (segment < len(seq_lens) // 2)
    return torch.where(in_sequence, tokens[0].to(labels.device), ignore_index)[None]


def completion_logit_sums(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the sum of the vocabulary-mean logit over the positions that predict a label, and their count.

    Args:
        logits (torch.Tensor): ``[b, s, v]``.
        labels (torch.Tensor): ``[b, s]``, not shifted; ``ignore_index`` where no token is scored.
        ignore_index (int): the ignored label. Default -100.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``[b]`` float32 sums (detached) and ``[b]`` int64 token counts.
    """
    mask = labels[:, 1:] != ignore_index  # position t predicts label t + 1
    mean_logits = logits[:, :-1].detach().float().mean(dim=-1) * mask  # [b, s - 1]
    return mean_logits.sum(dim=-1), mask.sum(dim=-1)


def sequence_log_probs(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    projection: Callable[[torch.Tensor], torch.Tensor],
    *,
    average_log_probs: bool = False,
    ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
    chunk_size: int = COMPLETION_CHUNK_SIZE,
    select_labelled: bool | None = None,
    labels_shifted: bool = False,
    nll_labels: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
) -> SequenceLogProbs:
    """:func:`get_batch_log_probs` and the logits metrics from a decoder's final hidden states, projecting only
    the positions that predict a label (the completions of preference pairs) onto the vocabulary.

    The hidden states of the labelled positions are gathered and projected ``chunk_size`` positions at a time; each
    chunk's logits are upcast to float32 (at least), log-softmaxed, and dropped: no ``[b, s, v]`` tensor exists.
    Under autograd a chunk's logits are not kept for backward either: for a frozen plain weight (``nn.Linear``
    without bias, or an embedding-tied :class:`~tune.modules.TiedLinear` without soft-capping) the gradient with
    respect to the hidden states is computed in the forward pass; any other projection (a LoRA output layer, a
    trained weight) runs each chunk under activation checkpointing, so backward projects it again. Same values as
    ``get_batch_log_probs(projection(hidden), labels)`` and ``completion_logit_sums``, to float32 rounding.

    On CPU only the labelled positions are gathered and projected. Gathering them reads their number, which on an
    accelerator is a host-device synchronisation inside the step: there every position is projected (still
    ``chunk_size`` at a time) and the unlabelled ones are zeroed, the same values without the synchronisation.

    Args:
        hidden (torch.Tensor): ``[b, s, d]`` final hidden states (a decoder run with ``skip_output_layer``).
        labels (torch.Tensor): ``[b, s]``, aligned with the tokens (not shifted); ``ignore_index`` where no
            log-probability is taken.
        projection (Callable[[torch.Tensor], torch.Tensor]): ``[n, d] -> [n, v]`` logits, e.g. ``model.output``.
        average_log_probs (bool): the mean over the labelled tokens instead of the sum (0 for a row without any),
            as IPO and SimPO use. Default False.
        ignore_index (int): the ignored label. Default -100.
        chunk_size (int): labelled positions projected at once. Default 2048.
        select_labelled (bool | None): project the labelled positions only (True) or every position (False);
            None (default) selects on CPU only, as said above.
        labels_shifted (bool): ``labels[t]`` is already the label position ``t`` predicts
            (``tune.modules.loss.shift_labels``), as for a context-parallel rank's slice (``nll_labels`` too).
            Default False.
        nll_labels (torch.Tensor | None): ``[b, s]`` a second set of labels (:func:`chosen_nll_labels`) whose
            summed negative log-likelihood per row is returned as ``nll_sums`` (and their count as
            ``nll_tokens``); the positions of both sets are projected once. Where both label a position they must
            agree. Default None.
        seq_lens (torch.Tensor | None): ``[n]`` the lengths of the sequences laid end to end in a padding-free
            row (``hidden`` ``[1, T, d]``, ``tune.data.padding_free_collate_dpo``): every result is then per
            sequence, ``[n]``, as for the same sequences padded into ``n`` rows. The labels at the sequences'
            first positions must be ``ignore_index`` (the collator sets them). Default None (one result per row).

    Returns:
        SequenceLogProbs: ``log_probs``, ``logit_sums`` and ``num_tokens``, each ``[b]`` (``[n]`` with
        ``seq_lens``), and ``nll_sums``, ``nll_tokens`` with ``nll_labels``.

    Raises:
        ValueError: when ``hidden`` is not ``[*labels.shape, d]``, ``chunk_size`` is not positive, or
            ``seq_lens`` is given for more than one row.
    """
    if hidden.dim() != 3 or hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"sequence_log_probs needs hidden states [b, s, d] and labels [b, s] with the same b and s; got hidden "
            f"{tuple(hidden.shape)} and labels {tuple(labels.shape)}."
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions, got {chunk_size}.")
    num_rows, seq_len, dim = hidden.shape
    if seq_lens is not None and (num_rows != 1 or seq_lens.dim() != 1):  # (their sum is not read: a host sync)
        raise ValueError(
            f"seq_lens must be the lengths of the sequences of one padding-free row: got seq_lens of shape "
            f"{tuple(seq_lens.shape)} for hidden states {tuple(hidden.shape)}."
        )

    def per_sequence(values: torch.Tensor) -> torch.Tensor:  # [b * s] -> [b] row sums, or [n] sequence sums
        if seq_lens is None:
            return values.view(num_rows, seq_len).sum(dim=-1)
        lengths = seq_lens.to(values.device)
        segment = torch.repeat_interleave(
            torch.arange(len(lengths), device=values.device), lengths, output_size=seq_len
        )
        return values.new_zeros(len(seq_lens)).index_add_(0, segment, values)

    def shifted(grid: torch.Tensor) -> torch.Tensor:  # [b, s]: the label position t predicts
        return grid if labels_shifted else F.pad(grid[:, 1:], (0, 1), value=ignore_index)

    targets_grid = shifted(labels)
    scored = targets_grid != ignore_index
    nll_scored = None
    if nll_labels is not None:  # project the positions of both sets, each target from the set that labels it
        nll_grid = shifted(nll_labels.to(labels.device))
        nll_scored = nll_grid != ignore_index
        targets_grid = torch.where(scored, targets_grid, nll_grid)
        scored, completion = scored | nll_scored, scored
    if select_labelled is None:
        select_labelled = hidden.device.type == "cpu"
    if select_labelled:
        rows, columns = scored.nonzero(as_tuple=True)  # the labelled positions, row by row
    else:  # every position, in the same row-major order (no data-dependent shape)
        rows = torch.arange(num_rows, device=labels.device).repeat_interleave(seq_len)
        columns = torch.arange(seq_len, device=labels.device).repeat(num_rows)
    selected = hidden.reshape(-1, dim).index_select(0, rows * seq_len + columns)  # [n, d]
    targets = targets_grid[rows, columns]  # [n]
    keep = scored[rows, columns]  # all True when selected
    token_log_probs, mean_logits = _project_log_probs(selected, targets.masked_fill(~keep, 0), projection, chunk_size)
    if not select_labelled:  # the unlabelled positions count for nothing (their gradient is zeroed too)
        token_log_probs, mean_logits = token_log_probs * keep, mean_logits * keep
    # back on the [b, s] grid (0 elsewhere) and summed per row, as get_batch_log_probs sums
    flat = rows * seq_len + columns
    grid = token_log_probs.new_zeros(num_rows * seq_len)
    nll_sums = nll_tokens = None
    if nll_scored is not None:  # the NLL over the second set; the log-probs and logits over the first only
        nll_sums = -per_sequence(grid.index_copy(0, flat, token_log_probs * nll_scored[rows, columns]))
        nll_tokens = per_sequence(nll_scored.flatten().long())
        in_completion = completion[rows, columns]
        token_log_probs, mean_logits = token_log_probs * in_completion, mean_logits * in_completion
        scored = completion
    log_probs = per_sequence(grid.index_copy(0, flat, token_log_probs))
    logit_sums = per_sequence(grid.index_copy(0, flat, mean_logits))
    num_tokens = per_sequence(scored.flatten().long())
    if average_log_probs:
        log_probs = log_probs / num_tokens.clamp(min=1)
    return SequenceLogProbs(log_probs, logit_sums.float(), num_tokens, nll_sums, nll_tokens)


def model_sequence_log_probs(
    model: nn.Module | Callable[[torch.Tensor], torch.Tensor],
    tokens: torch.Tensor,
    labels: torch.Tensor,
    *,
    average_log_probs: bool = False,
    ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
    context_parallel: "ContextParallel | None" = None,
    nll_labels: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    input_pos: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> SequenceLogProbs:
    """Runs ``model`` on ``tokens`` and scores the labelled tokens (the completions): :class:`SequenceLogProbs`.

    A decoder with an ``output`` projection and a ``skip_output_layer`` switch (every ``tune`` model) returns its
    hidden states for this call and only the labelled positions are projected (:func:`sequence_log_probs`). Any
    other module or callable (a user's own model) is taken to return logits ``[b, s, v]``, scored with
    :func:`get_batch_log_probs` and :func:`completion_logit_sums`. The reference model of LoRA DPO is the call
    under ``tune.modules.peft.disable_adapter(model)``: the projection runs inside it too.

    Args:
        model (nn.Module | Callable): the decoder (or a function of the tokens returning logits).
        tokens (torch.Tensor): ``[b, s]`` token ids.
        labels (torch.Tensor): ``[b, s]``, not shifted; ``ignore_index`` outside the completions.
        average_log_probs (bool): means over the labelled tokens instead of sums (IPO, SimPO). Default False.
        ignore_index (int): the ignored label. Default -100.
        context_parallel (tune.training.ContextParallel | None): under context parallelism, this rank runs its
            chunks of each sequence and the per-row sums are added over the group (every rank gets the whole rows'
            values). Default None.
        nll_labels (torch.Tensor | None): ``[b, s]`` labels (not shifted) whose summed negative log-likelihood per
            row is returned too (``nll_sums``, ``nll_tokens``): ORPO's chosen sequences, :func:`chosen_nll_labels`.
            Default None.
        seq_lens (torch.Tensor | None): ``[n]`` for a padding-free row (``tune.data.padding_free_collate_dpo``):
            the lengths of the sequences laid end to end in ``tokens`` ``[1, T]``; the results are per sequence,
            ``[n]``, equal to those of the same sequences padded into ``n`` rows. Needs a ``tune`` decoder, and
            ``input_pos`` and ``mask``. Default None.
        input_pos (torch.Tensor | None): ``[1, T]`` positions restarting at 0 for every sequence. Default None.
        mask (torch.Tensor | None): ``[1, T, T]`` block-causal mask (each sequence attends only itself).
            Default None.

    Returns:
        SequenceLogProbs: ``log_probs``, ``logit_sums`` and ``num_tokens``, each ``[b]`` (``[n]`` with
        ``seq_lens``), and ``nll_sums``, ``nll_tokens`` with ``nll_labels``.

    Raises:
        ValueError: for a padding-free row under context parallelism or with a model that is not a ``tune``
            decoder.
    """
    if seq_lens is not None:
        if context_parallel is not None and context_parallel.enabled:
            raise ValueError(
                "context parallelism cuts padded rows: set collate_fn: tune.data.padded_collate_dpo with "
                "context_parallel_dim > 1."
            )
        if getattr(model, "output", None) is None or not hasattr(model, "skip_output_layer"):
            raise ValueError(
                "padding-free batches are scored with tune decoders (a model with output and skip_output_layer); "
                "set collate_fn: tune.data.padded_collate_dpo for another model."
            )
    if context_parallel is not None and context_parallel.enabled:
        return _context_parallel_log_probs(
            model, tokens, labels, average_log_probs, ignore_index, context_parallel, nll_labels
        )
    projection = getattr(model, "output", None)
    if projection is None or not hasattr(model, "skip_output_layer"):
        logits = model(tokens)
        log_probs = get_batch_log_probs(logits, labels, ignore_index, return_average_logprobs=average_log_probs)
        nll_sums = nll_tokens = None
        if nll_labels is not None:
            nll_labels = nll_labels.to(labels.device)
            nll_sums = -get_batch_log_probs(logits, nll_labels, ignore_index)
            nll_tokens = (nll_labels[:, 1:] != ignore_index).sum(dim=-1)
        return SequenceLogProbs(log_probs, *completion_logit_sums(logits, labels, ignore_index), nll_sums, nll_tokens)
    previous = model.skip_output_layer
    model.skip_output_layer = True
    try:
        hidden = model(tokens) if seq_lens is None else model(tokens, mask=mask, input_pos=input_pos)
    finally:
        model.skip_output_layer = previous
    return sequence_log_probs(
        hidden,
        labels,
        projection,
        average_log_probs=average_log_probs,
        ignore_index=ignore_index,
        nll_labels=nll_labels,
        seq_lens=seq_lens,
    )


def _project_log_probs(
    hidden: torch.Tensor, targets: torch.Tensor, projection: Callable, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    # per position [n]: log p(target) and the vocabulary-mean logit, both float32 (at least)
    weight = _frozen_plain_weight(projection)
    if weight is not None and torch.is_grad_enabled() and hidden.requires_grad:
        return _FrozenProjectionLogProbs.apply(hidden, weight, targets, chunk_size)
    log_probs, mean_logits = [], []
    # split() of zero positions gives one empty chunk: the results keep their shapes, dtypes and graph
    for hidden_chunk, target_chunk in zip(hidden.split(chunk_size), targets.split(chunk_size)):
        if torch.is_grad_enabled():
            # backward projects the chunk again instead of keeping its [n, v] log-softmax
            chunk = checkpoint(_chunk_log_probs, projection, hidden_chunk, target_chunk, use_reentrant=False)
        else:
            chunk = _chunk_log_probs(projection, hidden_chunk, target_chunk)
        log_probs.append(chunk[0])
        mean_logits.append(chunk[1])
    return torch.cat(log_probs), torch.cat(mean_logits)


def _chunk_log_probs(
    projection: Callable, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = projection(hidden)  # [n, v] in the model dtype, as the output layer computes it
    if hasattr(logits, "full_tensor"):  # a DTensor from a tensor-parallel output layer
        logits = logits.full_tensor()
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = F.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    return log_probs, logits.detach().mean(dim=-1)


def _frozen_plain_weight(projection: Callable) -> torch.Tensor | None:
    """The weight of a projection that computes exactly ``x @ weight.T`` with a weight that is not trained."""
    if type(projection) is nn.Linear and projection.bias is None:  # not subclasses: they may change forward
        weight = projection.weight
    elif type(projection) is TiedLinear and projection.softcapping is None:
        weight = projection.weight
    else:
        return None
    if projection._forward_hooks or projection._forward_pre_hooks:
        return None  # hooks (a user's, FSDP's) must see the module called
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.requires_grad:  # DTensor, NF4; trained
        return None
    return weight


class _FrozenProjectionLogProbs(torch.autograd.Function):
    """Per-position log-probabilities through a frozen ``[v, d]`` weight, with d(log p)/d(hidden) computed in
    the forward pass, chunk by chunk: ``(one_hot(target) - softmax) @ weight``. Backward only scales those rows by
    the incoming gradient, so no chunk's logits are kept or projected again."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):  # noqa: D102 (class docstring)
        log_probs, mean_logits, grads = [], [], []
        # split() of zero positions gives one empty chunk: the results keep their shapes and dtypes
        for hidden_chunk, target_chunk in zip(hidden.split(chunk_size), targets.split(chunk_size)):
            logits = torch.mm(hidden_chunk, weight.t())  # [n, v] in the model dtype
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            mean_logits.append(logits.mean(dim=-1))
            chunk_log_probs = F.log_softmax(logits, dim=-1)
            del logits
            log_probs.append(chunk_log_probs.gather(1, target_chunk[:, None]).squeeze(1))
            # softmax - one_hot(target) = -d(log p)/d(logits), built in place of the log-softmax
            minus_grad = chunk_log_probs.exp_()
            minus_grad.scatter_add_(1, target_chunk[:, None], minus_grad.new_full((target_chunk.numel(), 1), -1.0))
            grads.append(torch.mm(minus_grad.to(weight.dtype), weight).neg_())  # [n, d]
            del chunk_log_probs, minus_grad
        ctx.save_for_backward(torch.cat(grads))
        mean_logits = torch.cat(mean_logits)
        ctx.mark_non_differentiable(mean_logits)
        return torch.cat(log_probs), mean_logits

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs, grad_mean_logits):  # noqa: D102
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_log_probs[:, None].to(grad_hidden.dtype), None, None, None


def truncate_sequence_for_logprobs(query_response_logits: torch.Tensor, context_length: int) -> torch.Tensor:
    """The logits that predict the response tokens of ``[query, response]`` sequences.

    Args:
        query_response_logits (torch.Tensor): ``[b, context_length + response_length, v]``.
        context_length (int): the length of the query (prompt).

    Returns:
        torch.Tensor: ``[b, response_length, v]``: position ``i`` predicts response token ``i``.
    """
    return query_response_logits[:, context_length - 1 : -1]


def get_reward_penalty_mask(
    padding_masks: torch.Tensor,
    seq_lens: torch.Tensor,
    penalise_no_eos: bool = True,
    min_response_length: int | None = None,
) -> torch.Tensor:
    """Which generated responses should have their score penalised: those that never stopped, or are too short.

    Expects responses truncated after their stop token and padded (see
    :func:`truncate_sequence_at_first_stop_token`): a response that stopped has at least one padding position.

    Args:
        padding_masks (torch.Tensor): ``[b, response_length]``, True on padding.
        seq_lens (torch.Tensor): ``[b]`` response lengths.
        penalise_no_eos (bool): penalise responses without a stop token. Default True.
        min_response_length (int | None): penalise responses shorter than this. Default None (no minimum).

    Returns:
        torch.Tensor: ``[b]`` bool, True where the score should be penalised.
    """
    penalise = torch.zeros_like(seq_lens, dtype=torch.bool)
    if penalise_no_eos:
        penalise = ~padding_masks.any(dim=-1)
    if min_response_length is not None:
        penalise = penalise | (seq_lens < min_response_length)
    return penalise


def _context_parallel_log_probs(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    average_log_probs: bool,
    ignore_index: int,
    context_parallel: "ContextParallel",
    nll_labels: torch.Tensor | None = None,
) -> SequenceLogProbs:
    if not hasattr(model, "skip_output_layer"):
        raise ValueError("context parallelism scores sequences with tune decoders (a model with skip_output_layer).")

    def shifted(grid: torch.Tensor) -> torch.Tensor:  # shifted before the sequence is cut
        return F.pad(grid[:, 1:], (0, 1), value=ignore_index)

    nll_targets = None
    if nll_labels is not None:  # this rank's slice of the NLL labels, cut as the tokens are
        _, nll_targets, _ = context_parallel.shard(tokens, shifted(nll_labels.to(labels.device)), {})
    tokens, targets, inputs = context_parallel.shard(tokens, shifted(labels), {})
    previous = model.skip_output_layer
    model.skip_output_layer = True
    try:
        hidden = model(tokens, **inputs)
    finally:
        model.skip_output_layer = previous
    scores = sequence_log_probs(
        hidden, targets, model.output, ignore_index=ignore_index, labels_shifted=True, nll_labels=nll_targets
    )
    # every value is a per-row sum over this rank's positions: the whole rows' sums are their sums over the group
    scores = SequenceLogProbs(*(None if value is None else context_parallel.sum(value) for value in scores))
    if average_log_probs:
        scores = scores._replace(log_probs=scores.log_probs / scores.num_tokens.clamp(min=1))
    return scores
