"""Sequence packing: many short documents per ``max_seq_len`` row, without cross-document attention.

Storage is compact and proportional to the number of tokens: all documents' tokens and labels live in two flat
int32 arrays with an offsets array (:class:`FlatSequences`); a packing is three small integer arrays describing
which slice of which document goes into which pack. A pack is assembled when it is read, and the block-causal
attention mask is built by the collator for the whole batch (:func:`block_causal_mask`), so no ``[s, s]`` mask is
ever stored.
"""

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from tune.data._common import CROSS_ENTROPY_IGNORE_IDX
from tune.utils import get_logger

_log = get_logger(name=__name__)


@dataclass
class FlatSequences:
    """Variable-length token/label sequences stored as flat arrays.

    Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (and the same slice of ``labels``).

    Args:
        tokens (np.ndarray): int32 [total_tokens].
        labels (np.ndarray): int32 [total_tokens], ``-100`` where no loss is taken.
        offsets (np.ndarray): int64 [num_docs + 1], starting at 0, non-decreasing.
    """

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_samples(cls, samples: Sequence[dict]) -> "FlatSequences":
        """Builds flat arrays from ``{"tokens": [...], "labels": [...]}`` samples (lists or tensors)."""
        lengths = np.fromiter((len(s["tokens"]) for s in samples), dtype=np.int64, count=len(samples))
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.empty(int(offsets[-1]), dtype=np.int32)
        labels = np.empty(int(offsets[-1]), dtype=np.int32)
        for i, sample in enumerate(samples):
            if len(sample["labels"]) != lengths[i]:
                raise ValueError(
                    f"Sample {i} has {lengths[i]} tokens but {len(sample['labels'])} labels; they must match."
                )
            tokens[offsets[i] : offsets[i + 1]] = np.asarray(sample["tokens"])
            labels[offsets[i] : offsets[i + 1]] = np.asarray(sample["labels"])
        return cls(tokens=tokens, labels=labels, offsets=offsets)

    @classmethod
    def concatenate(cls, parts: Sequence["FlatSequences"]) -> "FlatSequences":
        """Joins several flat stores into one, documents in order."""
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)]).astype(np.int64)
        return cls(
            tokens=np.concatenate([p.tokens for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            offsets=offsets,
        )


@dataclass
class Packing:
    """Where every document slice goes. Segment ``j`` is ``doc[seg_doc[j]][seg_start[j]:seg_start[j] + seg_len[j]]``;
    pack ``p`` holds segments ``pack_offsets[p]:pack_offsets[p + 1]`` in order."""

    seg_doc: np.ndarray
    seg_start: np.ndarray
    seg_len: np.ndarray
    pack_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.pack_offsets) - 1


def pack_lengths(
    lengths: np.ndarray, max_seq_len: int, *, split_across_pack: bool = False, max_packs: int | None = None
) -> Packing:
    """Greedy, order-preserving bin-packing of document lengths into packs of at most ``max_seq_len`` tokens.

    Documents are taken in order and appended to the current pack while they fit; otherwise a new pack starts
    (or, with ``split_across_pack``, the document fills the current pack and continues in the next). Keeping the
    data order means shuffling stays the sampler's job and packing is deterministic. Runs in O(num_docs).

    Args:
        lengths (np.ndarray): int [num_docs] document lengths, each in ``1..max_seq_len`` unless splitting.
        max_seq_len (int): tokens per pack.
        split_across_pack (bool): split documents at pack boundaries (continued pretraining) instead of moving
            them whole to the next pack.
        max_packs (int | None): stop after this many packs.

    Returns:
        Packing: the segment arrays.

    Raises:
        ValueError: for a non-positive ``max_seq_len`` or, without splitting, a document longer than it.
    """
    if max_seq_len <= 0:
        raise ValueError(f"max_seq_len must be positive, got {max_seq_len}.")
    lengths = np.asarray(lengths, dtype=np.int64)
    if not split_across_pack and len(lengths) and int(lengths.max()) > max_seq_len:
        bad = int(np.argmax(lengths > max_seq_len))
        raise ValueError(
            f"Document {bad} has {int(lengths[bad])} tokens, more than max_seq_len={max_seq_len}; truncate it "
            f"(set the tokenizer's max_seq_len) or pack with split_across_pack=True."
        )
    seg_doc, seg_start, seg_len, pack_offsets = [], [], [], [0]
    used = 0  # tokens in the current pack
    limit = max_packs if max_packs is not None else -1
    for doc, length in enumerate(lengths.tolist()):
        start = 0
        while length > 0:
            if used + length <= max_seq_len:
                take = length
            elif split_across_pack and used < max_seq_len:
                take = max_seq_len - used
            else:  # close the current pack
                pack_offsets.append(len(seg_doc))
                used = 0
                if len(pack_offsets) - 1 == limit:
                    break
                continue
            seg_doc.append(doc)
            seg_start.append(start)
            seg_len.append(take)
            used += take
            start += take
            length -= take
        if len(pack_offsets) - 1 == limit:
            break
    if used and len(pack_offsets) - 1 != limit:
        pack_offsets.append(len(seg_doc))
    return Packing(
        seg_doc=np.asarray(seg_doc, dtype=np.int64),
        seg_start=np.asarray(seg_start, dtype=np.int32),
        seg_len=np.asarray(seg_len, dtype=np.int32),
        pack_offsets=np.asarray(pack_offsets, dtype=np.int64),
    )


def _flatten_range(args: tuple) -> FlatSequences:
    ds, start, stop = args
    return FlatSequences.from_samples([ds[i] for i in range(start, stop)])


def flatten_dataset(ds: Dataset, num_proc: int = 1) -> FlatSequences:
    """Reads every ``{"tokens", "labels"}`` sample of a map-style dataset into a :class:`FlatSequences`.

    Datasets that already hold flat arrays provide them through an ``as_flat_sequences()`` method, which is used
    instead (no per-sample reading). Otherwise samples are read in ``num_proc`` processes (fork), each reading a
    contiguous range, so the dataset must be picklable when ``num_proc > 1``.

    Args:
        ds (Dataset): map-style dataset of dicts with ``tokens`` and ``labels``.
        num_proc (int): worker processes.

    Returns:
        FlatSequences: the documents in dataset order.
    """
    if hasattr(ds, "as_flat_sequences"):
        return ds.as_flat_sequences()
    n = len(ds)
    if num_proc <= 1 or n < 2 * num_proc:
        return _flatten_range((ds, 0, n))
    bounds = np.linspace(0, n, num_proc + 1).astype(int)
    with multiprocessing.get_context("fork").Pool(num_proc) as pool:
        parts = pool.map(_flatten_range, [(ds, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])])
    return FlatSequences.concatenate(parts)


class PackedDataset(Dataset):
    """Packs a dataset of ``{"tokens", "labels"}`` samples into rows of exactly ``max_seq_len`` tokens.

    Each item is a dict of tensors: ``tokens`` [max_seq_len] (padding ``padding_idx``), ``labels`` [max_seq_len]
    (``-100`` on padding and on the first token of every document, so that after the loss's one-token shift no
    document is trained to predict the start of the next one), ``input_pos`` [max_seq_len] (positions restart at
    0 for every document) and ``seq_lens`` [num_segments] (document lengths in the pack, the padding counted as a
    last segment). :func:`~tune.data.padded_collate_packed` turns ``seq_lens`` into the block-causal mask.

    Args:
        ds (Dataset): map-style dataset of samples with ``tokens`` and ``labels``.
        max_seq_len (int): tokens per pack.
        padding_idx (int): token id used for padding. Default 0.
        max_packs (int | None): keep at most this many packs.
        split_across_pack (bool): split documents at pack boundaries instead of moving them whole to the next
            pack. Default False.
        num_proc (int): processes used to read a dataset that does not provide flat arrays. Default 1.

    Raises:
        ValueError: for an empty dataset, or a sample longer than ``max_seq_len`` without ``split_across_pack``.
    """

    def __init__(
        self,
        ds: Dataset,
        *,
        max_seq_len: int,
        padding_idx: int = 0,
        max_packs: int | None = None,
        split_across_pack: bool = False,
        num_proc: int = 1,
    ) -> None:
        self.max_seq_len = max_seq_len
        self.padding_idx = padding_idx
        self.split_across_pack = split_across_pack
        self._flat = flatten_dataset(ds, num_proc=num_proc)
        if len(self._flat) == 0:
            raise ValueError("Cannot pack an empty dataset: it has no samples (check the source, split and filter).")
        self._packing = pack_lengths(
            self._flat.lengths, max_seq_len, split_across_pack=split_across_pack, max_packs=max_packs
        )
        self._positions = np.arange(max_seq_len, dtype=np.int64)
        # Packing keeps document order and splits only at pack boundaries, so a pack's segments are one contiguous
        # run of the flat arrays: each pack's first flat position and token count, computed once for all packs.
        p = self._packing
        firsts = p.pack_offsets[:-1]
        self._pack_src = self._flat.offsets[p.seg_doc[firsts]] + p.seg_start[firsts] if len(firsts) else firsts
        filled = np.concatenate(([0], np.cumsum(p.seg_len, dtype=np.int64)))
        self._pack_fill = filled[p.pack_offsets[1:]] - filled[firsts]
        seg_lens = p.seg_len.astype(np.int64)
        # where each segment starts in its pack
        self._seg_starts = np.cumsum(seg_lens) - seg_lens - np.repeat(filled[firsts], np.diff(p.pack_offsets))
        # every pack's segment lengths and starts with its padding as one more segment (a pack that is not full)
        padded = self._pack_fill < max_seq_len
        at = p.pack_offsets[1:][padded]  # where each padding segment goes in the segment arrays
        self._seq_lens = np.insert(seg_lens, at, max_seq_len - self._pack_fill[padded])
        self._seq_starts = np.insert(self._seg_starts, at, self._pack_fill[padded])
        self._seq_offsets = p.pack_offsets + np.concatenate(([0], np.cumsum(padded)))
        num_tokens = int(self._packing.seg_len.sum())
        _log.info(
            f"Packed {len(self._flat):,} samples ({num_tokens:,} tokens) into {len(self):,} packs of {max_seq_len} "
            f"tokens ({num_tokens / max(1, len(self) * max_seq_len):.1%} filled)."
        )

    def __len__(self) -> int:
        return len(self._packing)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"pack index {index} out of range for {len(self)} packs")
        p, flat, s = self._packing, self._flat, self.max_seq_len
        lo, hi = p.pack_offsets[index], p.pack_offsets[index + 1]
        n, src = int(self._pack_fill[index]), int(self._pack_src[index])
        tokens = np.empty(s, dtype=np.int64)
        labels = np.empty(s, dtype=np.int64)
        tokens[:n] = flat.tokens[src : src + n]  # one slice copy for the whole pack, not one per document
        labels[:n] = flat.labels[src : src + n]
        tokens[n:] = self.padding_idx
        labels[n:] = CROSS_ENTROPY_IGNORE_IDX
        labels[self._seg_starts[lo:hi]] = CROSS_ENTROPY_IGNORE_IDX  # no token predicts a document's first one
        first, last = self._seq_offsets[index], self._seq_offsets[index + 1]  # padding: one more segment
        seq_lens = self._seq_lens[first:last].copy()
        input_pos = self._positions - np.repeat(self._seq_starts[first:last], seq_lens)  # restart at every segment
        return {
            "tokens": torch.from_numpy(tokens),
            "labels": torch.from_numpy(labels),
            "input_pos": torch.from_numpy(input_pos),
            "seq_lens": torch.from_numpy(seq_lens),
        }


def block_causal_mask(seq_lens: Sequence[torch.Tensor], max_seq_len: int | None = None) -> torch.Tensor:
    """Builds the attention mask of a batch of packs: causal within each document, nothing across documents.

    Args:
        seq_lens (Sequence[torch.Tensor]): per pack, the lengths of its documents (including padding as a last
            segment); each must sum to the same length ``s``.
        max_seq_len (int | None): the expected ``s``; checked when given.

    Returns:
        torch.Tensor: bool [b, s, s], ``mask[i, q, k]`` True where query ``q`` may attend to key ``k``.

    Raises:
        ValueError: when the packs' lengths differ or do not equal ``max_seq_len``.
    """
    totals = {int(lens.sum()) for lens in seq_lens}
    if len(totals) != 1 or (max_seq_len is not None and totals != {max_seq_len}):
        raise ValueError(
            f"Every pack's seq_lens must sum to the same length{f' {max_seq_len}' if max_seq_len else ''}; "
            f"got sums {sorted(totals)}."
        )
    s = totals.pop()
    # document id of every position: [b, s]
    doc_ids = torch.stack([torch.repeat_interleave(torch.arange(len(lens)), lens.to(torch.int64)) for lens in seq_lens])
    same_doc = doc_ids.unsqueeze(2) == doc_ids.unsqueeze(1)  # [b, s, s]
    causal = torch.ones(s, s, dtype=torch.bool).tril_()
    return same_doc & causal
