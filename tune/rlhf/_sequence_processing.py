"""Log-probabilities of sequences under a language model, and the trimming of generated sequences.

Shapes: ``b`` sequences, ``s`` positions, ``v`` vocabulary entries. Labels follow the data convention of
``tune.data``: aligned with the tokens (not shifted), ``-100`` where no log-probability is taken.
"""

import torch
import torch.nn.functional as F

from tune.data import CROSS_ENTROPY_IGNORE_IDX


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
