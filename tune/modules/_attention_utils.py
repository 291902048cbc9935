"""Boolean attention masks (True = may attend) for padded and packed batches, and padded positions."""

import torch


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Lower-triangular [seq_len, seq_len] bool mask: query i may attend keys 0..i."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def get_causal_mask_from_padding_mask(padding_mask: torch.Tensor, target_seq_len: int | None = None) -> torch.Tensor:
    """Causal mask for a padded batch (left or right padding).

    A real token attends the real tokens at or before it. A padding query attends only itself, so its attention
    row is never empty (an all-False row would give NaN in softmax); its output is meaningless and should be
    ignored (label -100).

    Args:
        padding_mask (torch.Tensor): [b, s] bool, True for real tokens, False for padding.
        target_seq_len (int | None): width of the returned mask; extra key columns (not yet generated tokens of a
            KV cache) are False. Default: ``s``.

    Returns:
        torch.Tensor: [b, s, target_seq_len] bool.

    Raises:
        ValueError: if ``padding_mask`` is not 2-D bool or ``target_seq_len < s``.
    """
    if padding_mask.dim() != 2 or padding_mask.dtype != torch.bool:
        raise ValueError(
            f"padding_mask must be a [batch, seq] bool tensor, got shape {tuple(padding_mask.shape)} and dtype "
            f"{padding_mask.dtype}."
        )
    batch_size, seq_len = padding_mask.shape
    target_seq_len = seq_len if target_seq_len is None else target_seq_len
    if target_seq_len < seq_len:
        raise ValueError(f"target_seq_len ({target_seq_len}) must be at least the sequence length ({seq_len}).")
    eye = torch.eye(seq_len, dtype=torch.bool, device=padding_mask.device)
    real_pairs = padding_mask[:, :, None] & padding_mask[:, None, :]  # query and key both real
    mask = (causal_mask(seq_len, padding_mask.device)[None] & real_pairs) | eye[None]  # [b, s, s]
    if target_seq_len > seq_len:
        mask = torch.nn.functional.pad(mask, (0, target_seq_len - seq_len), value=False)
    return mask


def get_position_ids_from_padding_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    """Positions [b, s] that count only real tokens (0 for the left padding), for left-padded batches."""
    return ((padding_mask.cumsum(-1) - 1) * padding_mask).clamp(min=0).long()


def get_block_causal_mask_from_document_ids(document_ids: torch.Tensor) -> torch.Tensor:
    """Block-causal mask for packed sequences: a token attends earlier tokens of its own document only.

    Args:
        document_ids (torch.Tensor): [b, s] integer id of the document each token belongs to (padding may carry
            its own id).

    Returns:
        torch.Tensor: [b, s, s] bool.
    """
    if document_ids.dim() != 2:
        raise ValueError(f"document_ids must be [batch, seq], got shape {tuple(document_ids.shape)}.")
    same_document = document_ids[:, :, None] == document_ids[:, None, :]
    return same_document & causal_mask(document_ids.shape[1], document_ids.device)[None]


def create_block_causal_mask(seq_lens: list[torch.Tensor] | list[list[int]]) -> torch.Tensor:
    """Block-causal mask for packed sequences given the length of each document in each row.

    Args:
        seq_lens (list): one entry per row, each a 1-D tensor (or list) of document lengths that sum to the same
            packed length ``s`` for every row.

    Returns:
        torch.Tensor: [b, s, s] bool.

    Raises:
        ValueError: if the rows do not have the same total length.
    """
    rows = [torch.as_tensor(lengths, dtype=torch.long) for lengths in seq_lens]
    totals = {int(row.sum()) for row in rows}
    if len(totals) != 1:
        raise ValueError(f"Every row of seq_lens must sum to the same packed length; got totals {sorted(totals)}.")
    document_ids = torch.stack([torch.repeat_interleave(torch.arange(len(row)), row) for row in rows])  # [b, s]
    return get_block_causal_mask_from_document_ids(document_ids)


def packed_block_causal_mask(seq_lens: list[torch.Tensor]) -> torch.Tensor:
    """The attention mask of packed sequences: causal within each document, nothing across documents.

    torchtune returns a flex-attention ``BlockMask`` on GPUs that support it; tune's attention takes the dense
    boolean mask everywhere (and attends packed documents one at a time when it can), so this is
    :func:`create_block_causal_mask`.

    Args:
        seq_lens (list[torch.Tensor]): one 1-D tensor of document lengths per row, each summing to the packed
            length ``s``.

    Returns:
        torch.Tensor: [b, s, s] bool, True where a query may attend a key.

    Raises:
        ValueError: if the rows do not have the same total length.
    """
    return create_block_causal_mask(seq_lens)
