"""Collate functions: turn a list of samples into a batch of tensors.

Batches are dicts: ``tokens`` [b, s] int64, ``labels`` [b, s] int64 (``-100`` where no loss is taken, not
shifted), and for packed batches ``mask`` [b, s, s] bool and ``input_pos`` [b, s].
"""

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from tune.data._common import CROSS_ENTROPY_IGNORE_IDX
from tune.data._packing import PackedDataset, block_causal_mask


def _as_long(x: Any) -> torch.Tensor:
    return x.to(torch.int64) if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.int64)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_right(seqs: list[torch.Tensor], value: int, length: int) -> torch.Tensor:
    out = torch.full((len(seqs), length), value, dtype=torch.int64)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = seq
    return out


def left_pad_sequence(
    sequences: Sequence[torch.Tensor], batch_first: bool = False, padding_value: float = 0
) -> torch.Tensor:
    """Like :func:`torch.nn.utils.rnn.pad_sequence`, but pads on the left so every sequence ends at the last column.

    Args:
        sequences (Sequence[torch.Tensor]): tensors [len_i, *].
        batch_first (bool): return [b, s, *] instead of [s, b, *].
        padding_value (float): fill value.

    Returns:
        torch.Tensor: the padded batch.
    """
    flipped = pad_sequence([seq.flip(0) for seq in sequences], batch_first=True, padding_value=padding_value)
    out = flipped.flip(1)  # [b, s, *]
    return out if batch_first else out.transpose(0, 1)


def padded_collate(
    batch: Sequence[dict[str, Any]],
    *,
    pad_direction: str,
    keys_to_pad: Sequence[str],
    padding_idx: int | dict[str, int],
) -> dict[str, Any]:
    """Pads the listed keys of every sample to the batch's longest, left or right; other keys are gathered in lists.

    Args:
        batch (Sequence[dict]): samples.
        pad_direction (str): ``"left"`` or ``"right"``.
        keys_to_pad (Sequence[str]): keys holding 1-D sequences.
        padding_idx (int | dict[str, int]): one fill value, or one per key.

    Returns:
        dict: padded [b, s] tensors for ``keys_to_pad``, lists for other keys.

    Raises:
        ValueError: for an unknown direction or a key missing from ``padding_idx``.
    """
    if pad_direction not in ("left", "right"):
        raise ValueError(f"pad_direction must be 'left' or 'right', got {pad_direction!r}.")
    if isinstance(padding_idx, dict) and set(keys_to_pad) - set(padding_idx):
        raise ValueError(f"padding_idx has no value for key(s) {sorted(set(keys_to_pad) - set(padding_idx))}.")
    out: dict[str, Any] = {}
    for key in batch[0]:
        values = [sample[key] for sample in batch]
        if key not in keys_to_pad:
            out[key] = values
            continue
        fill = padding_idx[key] if isinstance(padding_idx, dict) else padding_idx
        seqs = [_as_long(v) for v in values]
        if pad_direction == "right":
            out[key] = pad_sequence(seqs, batch_first=True, padding_value=fill)
        else:
            out[key] = left_pad_sequence(seqs, batch_first=True, padding_value=fill)
    return out


def padded_collate_sft(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    pad_to_multiple_of: int = 1,
) -> dict[str, torch.Tensor]:
    """Right-pads ``tokens`` with ``padding_idx`` and ``labels`` with ``ignore_idx`` to the longest sample.

    Args:
        batch (Sequence[dict]): samples with ``tokens`` and ``labels`` of equal length (lists or tensors).
        padding_idx (int): token id for padding. Default 0.
        ignore_idx (int): label for padding. Default -100.
        pad_to_multiple_of (int): round the padded length up to a multiple of this (e.g. 8 for tensor cores,
            or a fixed shape for compile). Default 1.

    Returns:
        dict[str, torch.Tensor]: ``tokens`` and ``labels``, int64 [b, s].

    Raises:
        ValueError: for an empty batch, a sample whose tokens and labels differ in length, or
            ``pad_to_multiple_of < 1``.
    """
    if not batch:
        raise ValueError("padded_collate_sft got an empty batch.")
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}.")
    tokens = [_as_long(sample["tokens"]) for sample in batch]
    labels = [_as_long(sample["labels"]) for sample in batch]
    for i, (t, lab) in enumerate(zip(tokens, labels)):
        if len(t) != len(lab):
            raise ValueError(f"Sample {i} of the batch has {len(t)} tokens but {len(lab)} labels.")
    length = _round_up(max(len(t) for t in tokens), pad_to_multiple_of)
    return {"tokens": _pad_right(tokens, padding_idx, length), "labels": _pad_right(labels, ignore_idx, length)}


def padded_collate_packed(batch: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stacks packs from :class:`~tune.data.PackedDataset` and builds their block-causal mask.

    Args:
        batch (Sequence[dict]): packs with ``tokens``, ``labels``, ``input_pos`` [s] and ``seq_lens``.

    Returns:
        dict[str, torch.Tensor]: ``tokens``, ``labels``, ``input_pos`` int64 [b, s] and ``mask`` bool [b, s, s]
        (True = may attend).
    """
    tokens = torch.stack([_as_long(p["tokens"]) for p in batch])
    return {
        "tokens": tokens,
        "labels": torch.stack([_as_long(p["labels"]) for p in batch]),
        "input_pos": torch.stack([_as_long(p["input_pos"]) for p in batch]),
        "mask": block_causal_mask([_as_long(p["seq_lens"]) for p in batch], tokens.shape[1]),
    }


def padded_collate_dpo(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> tuple[torch.Tensor, ...]:
    """Pads preference pairs into one batch: the chosen sequences first, then the rejected ones.

    Args:
        batch (Sequence[dict]): samples with ``chosen_input_ids``, ``chosen_labels``, ``rejected_input_ids``,
            ``rejected_labels`` and, from a dataset with a margin column, ``margin``.
        padding_idx (int): token id for padding. Default 0.
        ignore_idx (int): label for padding. Default -100.

    Returns:
        tuple[torch.Tensor, ...]: ``(input_ids, labels)``, int64 [2 * b, s]; rows ``0..b-1`` are the chosen
        responses, rows ``b..2b-1`` the rejected ones, in the same order. When the samples carry ``margin``, a
        third entry: the pairs' margins, float32 [b].
    """
    tokens = [_as_long(s["chosen_input_ids"]) for s in batch] + [_as_long(s["rejected_input_ids"]) for s in batch]
    labels = [_as_long(s["chosen_labels"]) for s in batch] + [_as_long(s["rejected_labels"]) for s in batch]
    length = max(len(t) for t in tokens)
    padded = (_pad_right(tokens, padding_idx, length), _pad_right(labels, ignore_idx, length))
    if batch and "margin" in batch[0]:
        return (*padded, torch.tensor([float(s["margin"]) for s in batch], dtype=torch.float32))
    return padded


@dataclass
class PreferenceBatch:
    """One micro-batch of preference pairs, from either pair collator: the chosen sequences first, then the rejected
    ones, padded into ``[2b, s]`` rows (:func:`padded_collate_dpo`) or laid end to end in one ``[1, T]`` row
    (:func:`padding_free_collate_dpo`, which also gives ``seq_lens``, ``input_pos`` and ``mask``).

    Attributes:
        tokens (torch.Tensor): int64 ``[2b, s]`` or ``[1, T]``.
        labels (torch.Tensor): int64, the shape of ``tokens``, not shifted; ``-100`` outside the completions.
        margin (torch.Tensor | None): float32 ``[b]``, the pairs' margins when the dataset has them.
        seq_lens (torch.Tensor | None): int64 ``[2b]``, the sequences' lengths in a padding-free row; None when
            padded.
        input_pos (torch.Tensor | None): int64 ``[1, T]``, positions restarting at 0 for every sequence.
        mask (torch.Tensor | None): bool ``[1, T, T]``, the block-causal mask (each sequence attends only itself).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    margin: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    input_pos: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def num_pairs(self) -> int:
        """The number of pairs ``b`` (read from shapes: no host-device synchronisation)."""
        rows = self.tokens.shape[0] if self.seq_lens is None else self.seq_lens.shape[0]
        return rows // 2

    @property
    def packed(self) -> dict[str, torch.Tensor]:
        """``seq_lens``, ``input_pos`` and ``mask`` for a padding-free row (the keyword arguments of
        ``tune.rlhf.model_sequence_log_probs``); empty when padded."""
        if self.seq_lens is None:
            return {}
        return {"seq_lens": self.seq_lens, "input_pos": self.input_pos, "mask": self.mask}

    def last_token_positions(self, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each sequence's last non-padding token is, as transformers' sequence classifiers read a score.

        Args:
            pad_id (int): the padding token id.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``(rows, columns)``, int64 ``[2b]`` each, indexing ``tokens``; a
            sequence made only of ``pad_id`` gives its first position.
        """
        num_rows, seq_len = self.tokens.shape
        positions = torch.arange(seq_len, device=self.tokens.device)
        if self.seq_lens is None:
            last = torch.where(self.tokens != pad_id, positions, -1).amax(dim=-1).clamp(min=0)
            return torch.arange(num_rows, device=self.tokens.device), last
        seq_lens = self.seq_lens.to(self.tokens.device)
        # output_size: no host-device synchronisation to find the length
        segment = torch.repeat_interleave(
            torch.arange(len(seq_lens), device=seq_lens.device), seq_lens, output_size=seq_len
        )
        starts = seq_lens.cumsum(0) - seq_lens
        # per sequence, the largest position of a real token; its start when it has none
        last = starts.scatter_reduce(0, segment, torch.where(self.tokens[0] != pad_id, positions, -1), reduce="amax")
        return torch.zeros_like(last), last

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "PreferenceBatch":
        """The same batch with every tensor on ``device``."""
        moved = {
            name: None if value is None else value.to(device, non_blocking=non_blocking)
            for name, value in vars(self).items()
        }
        return PreferenceBatch(**moved)


def preference_batch(batch: Sequence[torch.Tensor] | dict[str, torch.Tensor]) -> PreferenceBatch:
    """The output of a pair collator as a :class:`PreferenceBatch`.

    Args:
        batch (Sequence[torch.Tensor] | dict[str, torch.Tensor]): ``(tokens, labels)`` or ``(tokens, labels,
            margin)`` from :func:`padded_collate_dpo` (a user's collator of that form too), or the dict of
            :func:`padding_free_collate_dpo`.

    Returns:
        PreferenceBatch: the same tensors, by name.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(batch, PreferenceBatch):
        return batch
    if isinstance(batch, dict):
        return PreferenceBatch(**batch)
    if isinstance(batch, Sequence) and len(batch) in (2, 3):
        return PreferenceBatch(*batch)
    raise ValueError(
        "a preference batch is (tokens, labels[, margin]) from tune.data.padded_collate_dpo or the dict of "
        f"tune.data.padding_free_collate_dpo; got {type(batch).__name__}"
        + (f" of {len(batch)} entries" if isinstance(batch, Sequence) else "")
    )


def padded_collate_generation(batch: Sequence[dict[str, Any]], padding_idx: int = 0) -> dict[str, torch.Tensor]:
    """Left-pads prompts so that every row's last prompt token is in the last column, ready for generation.

    Args:
        batch (Sequence[dict]): samples with ``tokens`` (the prompt); other keys are ignored.
        padding_idx (int): token id for padding. Default 0.

    Returns:
        dict[str, torch.Tensor]: ``tokens`` int64 [b, s]; ``padding_mask`` bool [b, s] (True on real tokens);
        ``input_pos`` int64 [b, s], each row's positions counted from its first real token (0 on padding).
    """
    tokens = left_pad_sequence([_as_long(s["tokens"]) for s in batch], batch_first=True, padding_value=padding_idx)
    lengths = torch.tensor([len(s["tokens"]) for s in batch])
    columns = torch.arange(tokens.shape[1])
    padding_mask = columns.unsqueeze(0) >= (tokens.shape[1] - lengths).unsqueeze(1)
    input_pos = (padding_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"tokens": tokens, "padding_mask": padding_mask, "input_pos": input_pos}


# Padding-free batches: the samples of a batch laid end to end in one row, instead of padded to the longest.
#
# A right-padded batch of ``b`` samples spends compute on ``b * max_len - sum(len)`` padding positions in every
# linear layer (about 40% of the positions for Alpaca-like length distributions at batch size 4). Laid end to end in
# one row with a block-causal mask and per-sample positions, the same samples cost only their real tokens, and the
# loss and gradients are those of the padded batch: each sample attends only to itself and restarts its positions
# at 0, and the first label of every sample is ignored, so that after the one-position label shift the last token
# of a sample predicts nothing, as it predicts padding in a padded batch. On CPU, ``MultiHeadAttention`` runs such
# a block-causal mask one document at a time (``is_causal`` inside each), so attention costs what it costs in the
# padded batch.
#
# Packs from ``PackedDataset`` are padded too, to ``max_seq_len`` after their last document (about 17% of the
# positions for Alpaca-like data at 512). Their documents already carry their positions and their ignored first
# labels; the row keeps every document that has a label to train on and drops the rest (the padding segment):
# those add nothing to the loss, and under a block-causal mask no other document sees them.
def padding_free_collate(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    max_seq_len: int | None = None,
) -> dict[str, torch.Tensor]:
    """Collates SFT samples, or packs, into one padding-free row (or a padded batch when that row would be too long).

    Args:
        batch (Sequence[dict[str, Any]]): samples with ``tokens`` and ``labels`` of equal length (lists or
            tensors; labels aligned with tokens, not shifted); or packs from :class:`~tune.data.PackedDataset`
            (``tokens``, ``labels``, ``input_pos`` and ``seq_lens``).
        padding_idx (int): token id used only by the padded fallback. Default 0.
        ignore_idx (int): the label that contributes no loss. Default -100.
        max_seq_len (int | None): the longest row the model accepts (``model.max_seq_len``); a batch whose
            samples add up to more is returned padded by ``tune.data.padded_collate_sft`` (packs: by
            ``tune.data.padded_collate_packed``) instead. None: no limit.

    Returns:
        dict[str, torch.Tensor]: ``tokens`` and ``labels`` int64 [1, T], ``input_pos`` int64 [1, T] (positions
        restarting at 0 for every sample) and ``mask`` bool [1, T, T] (block-causal), with T the total number of
        tokens; or the padded fallback's batch.

    Raises:
        ValueError: for an empty batch or a sample whose tokens and labels differ in length.
    """
    if not batch:
        raise ValueError("padding_free_collate got an empty batch.")
    if "seq_lens" in batch[0]:
        return _padding_free_packs(batch, ignore_idx, max_seq_len)
    tokens = [torch.as_tensor(sample["tokens"], dtype=torch.long) for sample in batch]
    labels = [torch.as_tensor(sample["labels"], dtype=torch.long) for sample in batch]
    for i, (t, lab) in enumerate(zip(tokens, labels)):
        if t.shape != lab.shape or t.dim() != 1:
            raise ValueError(
                f"Sample {i} of the batch has tokens of shape {tuple(t.shape)} but labels of shape "
                f"{tuple(lab.shape)}; both must be 1-D and of the same length."
            )
    lengths = [len(t) for t in tokens]
    total = sum(lengths)
    if max_seq_len is not None and total > max_seq_len:
        return padded_collate_sft(batch, padding_idx=padding_idx, ignore_idx=ignore_idx)
    seq_lens = torch.tensor(lengths)
    labels = torch.cat(labels)
    starts = seq_lens.cumsum(0) - seq_lens
    labels[starts[seq_lens > 0]] = ignore_idx  # the shift must not cross from one sample into the next
    input_pos = torch.arange(total) - starts.repeat_interleave(seq_lens)
    return {
        "tokens": torch.cat(tokens)[None],
        "labels": labels[None],
        "input_pos": input_pos[None],
        "mask": block_causal_mask([seq_lens], total),  # [1, T, T], as for a pack of these samples
    }


def _padding_free_packs(
    batch: Sequence[dict[str, Any]], ignore_idx: int, max_seq_len: int | None
) -> dict[str, torch.Tensor]:
    seq_lens = torch.cat([_as_long(p["seq_lens"]) for p in batch])
    labels = torch.cat([_as_long(p["labels"]) for p in batch])
    if labels.numel() != int(seq_lens.sum()):
        raise ValueError(f"The packs hold {labels.numel()} labels but their seq_lens add up to {int(seq_lens.sum())}.")
    segment = torch.repeat_interleave(torch.arange(len(seq_lens)), seq_lens)
    trained = torch.zeros(len(seq_lens), dtype=torch.long).index_add_(0, segment, (labels != ignore_idx).long())
    keep_segment = trained > 0
    keep = keep_segment[segment]
    total = int(keep.sum())
    if total == 0 or (max_seq_len is not None and total > max_seq_len):
        return padded_collate_packed(batch)
    kept_lens = seq_lens[keep_segment]
    return {
        "tokens": torch.cat([_as_long(p["tokens"]) for p in batch])[keep][None],
        "labels": labels[keep][None],
        "input_pos": torch.cat([_as_long(p["input_pos"]) for p in batch])[keep][None],
        "mask": block_causal_mask([kept_lens], total),
    }


# Padding-free preference pairs: the 2b sequences of a batch of pairs (chosen first, then rejected, as in
# padded_collate_dpo) end to end in one row. A padded pair batch computes 2b * (longest - mean length) padding
# positions; laid end to end, each sequence attends only itself (block-causal mask) from position 0, so every
# per-sequence log-probability, score and gradient is the padded batch's. The sequences' lengths (seq_lens) let
# tune.rlhf.model_sequence_log_probs sum per sequence and the reward recipes read each sequence's last score.
def padding_free_collate_dpo(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    max_seq_len: int | None = None,
) -> dict[str, torch.Tensor] | tuple[torch.Tensor, ...]:
    """Collates preference pairs into one padding-free row: the chosen sequences, then the rejected ones.

    Args:
        batch (Sequence[dict]): samples with ``chosen_input_ids``, ``chosen_labels``, ``rejected_input_ids``,
            ``rejected_labels`` and, from a dataset with a margin column, ``margin``.
        padding_idx (int): token id used only by the padded fallback. Default 0.
        ignore_idx (int): the label that contributes no log-probability. Default -100.
        max_seq_len (int | None): the longest row the model accepts (``model.max_seq_len``); a batch whose 2b
            sequences add up to more is returned padded by :func:`padded_collate_dpo` instead. None: no limit.

    Returns:
        dict[str, torch.Tensor] | tuple[torch.Tensor, ...]: ``tokens`` and ``labels`` int64 [1, T] (each
        sequence's first label set to ``ignore_idx``, which the padded batch never uses either), ``seq_lens``
        int64 [2b] (chosen sequences first), ``input_pos`` int64 [1, T] (restarting at 0 for every sequence),
        ``mask`` bool [1, T, T] (block-causal) and, when the samples carry it, ``margin`` float32 [b]; or the
        padded fallback's tuple. :func:`preference_batch` reads either.

    Raises:
        ValueError: for an empty batch, or a sequence whose tokens and labels differ in length.
    """
    if not batch:
        raise ValueError("padding_free_collate_dpo got an empty batch.")
    sides = ("chosen", "rejected")
    tokens = [_as_long(s[f"{side}_input_ids"]) for side in sides for s in batch]
    labels = [_as_long(s[f"{side}_labels"]) for side in sides for s in batch]
    for i, (t, lab) in enumerate(zip(tokens, labels)):
        if t.shape != lab.shape or t.dim() != 1:
            side, pair = sides[i // len(batch)], i % len(batch)
            raise ValueError(
                f"Pair {pair} of the batch has {side} input ids of shape {tuple(t.shape)} but labels of shape "
                f"{tuple(lab.shape)}; both must be 1-D and of the same length."
            )
    seq_lens = torch.tensor([len(t) for t in tokens])
    total = int(seq_lens.sum())
    if max_seq_len is not None and total > max_seq_len:
        return padded_collate_dpo(batch, padding_idx=padding_idx, ignore_idx=ignore_idx)
    starts = seq_lens.cumsum(0) - seq_lens
    labels = torch.cat(labels)
    labels[starts[seq_lens > 0]] = ignore_idx  # the shift must not cross from one sequence into the next
    out = {
        "tokens": torch.cat(tokens)[None],
        "labels": labels[None],
        "seq_lens": seq_lens,
        "input_pos": (torch.arange(total) - starts.repeat_interleave(seq_lens))[None],
        "mask": block_causal_mask([seq_lens], total),  # [1, T, T]
    }
    if "margin" in batch[0]:
        out["margin"] = torch.tensor([float(s["margin"]) for s in batch], dtype=torch.float32)
    return out


def is_packed(dataset: Any) -> bool:
    """Whether ``dataset`` yields packs (of :class:`~tune.data.PackedDataset`) rather than single samples.

    Decided from the dataset itself: a ``PackedDataset``, an object whose ``packed`` attribute is True (tune's
    ``ConcatDataset`` of packed datasets), or a composite (``torch.utils.data.ConcatDataset``, a user's mix)
    whose ``datasets`` are all packed.

    Raises:
        ValueError: for a composite that mixes packed and unpacked datasets (no one collator fits both).
    """
    if isinstance(dataset, PackedDataset) or getattr(dataset, "packed", False) is True:
        return True
    parts = getattr(dataset, "datasets", None)
    if not isinstance(parts, Sequence) or isinstance(parts, (str, bytes)) or not parts:
        return False
    packed = [is_packed(part) for part in parts]
    if any(packed) and not all(packed):
        raise ValueError(
            f"the dataset mixes packed and unpacked datasets (packed: {packed}); set packed the same on every one"
        )
    return all(packed)


def collate_for_dataset(
    collate_fn: Callable[..., Any],
    dataset: Any,
    *,
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    max_seq_len: int | None = None,
) -> Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]]:
    """Fits a collate function to the samples of ``dataset``, and binds the arguments it takes.

    Packs need the block-causal mask and restarting positions of :func:`padded_collate_packed`: for a packed
    dataset (see :func:`is_packed`) ``padded_collate_sft`` is replaced by it, so a concatenation or mix of packed
    datasets is collated as packs, whatever the config's ``packed`` keys say. ``padding_idx``, ``ignore_idx`` and
    ``max_seq_len`` are bound where the function's signature takes them.

    Args:
        collate_fn (Callable): the collate function chosen (``padded_collate_sft``, ``padding_free_collate``, a
            user's function).
        dataset (Any): the dataset whose samples it will collate.
        padding_idx (int): the pad token id. Default 0.
        ignore_idx (int): the label that gets no loss. Default -100.
        max_seq_len (int | None): the longest row the model accepts. Default None.

    Returns:
        Callable: ``batch -> dict of tensors``.

    Raises:
        ValueError: for ``padded_collate_packed`` on a dataset that is not packed, or a mixed dataset.
    """
    packed = is_packed(dataset)
    if packed and collate_fn is padded_collate_sft:
        collate_fn = padded_collate_packed
    if not packed and collate_fn is padded_collate_packed:
        raise ValueError(
            "padded_collate_packed needs a packed dataset (packed: True); use tune.data.padded_collate_sft"
        )
    try:
        params = inspect.signature(collate_fn).parameters
    except (TypeError, ValueError):
        return collate_fn
    known = {"padding_idx": padding_idx, "ignore_idx": ignore_idx, "max_seq_len": max_seq_len}
    bound = {name: value for name, value in known.items() if name in params}
    return partial(collate_fn, **bound) if bound else collate_fn
