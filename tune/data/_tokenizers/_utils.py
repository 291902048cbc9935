"""Helpers shared by the text tokenizers: truncation and turning rendered segments into tokens plus flags."""

import array
import bisect
import itertools
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tune import utils
from tune.data._chat_formats import Segment
from tune.utils import TuneError


def truncate(tokens: list, max_seq_len: int, eos_id=None) -> list:
    """Cuts ``tokens`` to ``max_seq_len`` items; when it cut and ``eos_id`` is given, the last item becomes it.

    Args:
        tokens (list): token ids (or mask values).
        max_seq_len (int): the maximum length.
        eos_id (Any): the value put last when the list was cut (e.g. the EOS id, or ``True`` for a mask).

    Returns:
        list: the (possibly) shortened list; the input is not modified.

    Raises:
        ValueError: if ``max_seq_len`` is not a positive integer.
    """
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}.")
    if len(tokens) <= max_seq_len:
        return list(tokens)
    out = list(tokens[:max_seq_len])
    if eos_id is not None:
        out[-1] = eos_id
    return out


def char_flags(segments: Sequence[Segment]) -> tuple[str, bytearray]:
    """Joins the segments' text and returns it with a per-character trainable flag."""
    text = "".join(s.text for s in segments)
    flags = bytearray()
    for s in segments:
        flags.extend((b"\x01" if s.trainable else b"\x00") * len(s.text))
    return text, flags


def byte_flags(segments: Sequence[Segment]) -> tuple[str, bytearray]:
    """Joins the segments' text and returns it with a trainable flag per UTF-8 byte."""
    text = "".join(s.text for s in segments)
    flags = bytearray()
    for s in segments:
        flags.extend((b"\x01" if s.trainable else b"\x00") * len(s.text.encode("utf-8")))
    return text, flags


def token_flags(
    offsets: Sequence[tuple[int, int]],
    flags: bytearray,
    ids: Sequence[int] = (),
    atomic: "Collection[int]" = (),
) -> list[bool]:
    """Whether each token is trained, from its span in the text and the per-position flags.

    A token is trained when any position it covers is: tokens can straddle a boundary the template draws inside
    one piece of text (Llama 2's ``" "`` + answer becomes one ``"▁answer"`` token), and such a token carries
    answer text. An empty span, or a token whose id is in ``atomic`` (added tokens such as ``<|im_end|>``, which
    may swallow neighbouring whitespace), takes the flag at its start.
    """
    num_tokens = len(offsets)
    if not flags or not num_tokens:
        return [False] * num_tokens
    flag_array = np.frombuffer(bytes(flags), dtype=np.uint8)
    last = len(flag_array) - 1
    # trained positions before each index, so "any trained position in [start, end)" is one subtraction
    before = np.zeros(len(flag_array) + 1, dtype=np.int64)
    np.cumsum(flag_array, out=before[1:])
    spans = np.asarray(offsets, dtype=np.int64).reshape(num_tokens, 2)
    start = np.minimum(spans[:, 0], last + 1)
    end = np.clip(spans[:, 1], start, last + 1)
    trained = before[end] > before[start]
    at_start = flag_array[np.minimum(spans[:, 0], last)] == 1
    point = spans[:, 1] <= spans[:, 0]
    if atomic:
        point |= np.isin(np.asarray(ids, dtype=np.int64), np.fromiter(atomic, dtype=np.int64))
    return np.where(point, at_start, trained).tolist()


def token_flags_batch(
    offsets: Sequence[Sequence[tuple[int, int]]],
    flags: Sequence[bytearray],
    ids: Sequence[Sequence[int]],
    atomic: "Collection[int]" = (),
) -> list[list[bool]]:
    """:func:`token_flags` of several texts at once (the same result, text by text), in one set of array
    operations over all their tokens instead of one per text."""
    counts = [len(o) for o in offsets]
    total = sum(counts)
    if not total:
        return [[] for _ in counts]
    spans = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(offsets)), dtype=np.int64, count=2 * total
    ).reshape(total, 2)
    lengths = np.fromiter(map(len, flags), dtype=np.int64, count=len(flags))
    text_start = np.repeat(np.cumsum(lengths) - lengths, counts)  # each token's text, as a position in all texts
    text_length = np.repeat(lengths, counts)
    flag_array = np.frombuffer(b"".join(flags), dtype=np.uint8)
    before = np.zeros(len(flag_array) + 1, dtype=np.int64)
    np.cumsum(flag_array, out=before[1:])
    start = np.minimum(spans[:, 0], text_length)
    end = np.clip(spans[:, 1], start, text_length)
    trained = before[text_start + end] > before[text_start + start]
    at = text_start + np.minimum(spans[:, 0], text_length - 1)
    at_start = flag_array[np.clip(at, 0, max(len(flag_array) - 1, 0))] == 1 if len(flag_array) else trained
    point = spans[:, 1] <= spans[:, 0]
    if atomic:
        all_ids = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)
        point |= np.isin(all_ids, np.fromiter(atomic, dtype=np.int64))
    result = np.where(point, at_start, trained) & (text_length > 0)  # a text without flags trains nothing
    flat = result.tolist()
    out, position = [], 0
    for count in counts:
        out.append(flat[position : position + count])
        position += count
    return out


def byte_runs(segments: Sequence[Segment]) -> tuple[str, list[tuple[int, bool]]]:
    """Joins the segments' text and returns it with ``(UTF-8 byte end, trainable)`` for each segment."""
    runs, end = [], 0
    for s in segments:
        end += len(s.text) if s.text.isascii() else len(s.text.encode("utf-8"))
        runs.append((end, s.trainable))
    return "".join(s.text for s in segments), runs


def flags_from_lengths(lengths: Sequence[int], runs: Sequence[tuple[int, bool]]) -> list[bool]:
    """:func:`token_flags` for tokens that tile the text: token i spans ``[sum(lengths[:i]), sum(lengths[:i+1]))``
    UTF-8 bytes, and the text is ``runs`` of positions with one flag each (``(end, trainable)``, see
    :func:`byte_runs`).

    Same rule as :func:`token_flags` (trained when any byte it covers is; an empty token takes the flag of the
    byte at its start). One text of :func:`flags_from_lengths_batch`.
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    return flags_from_lengths_batch(lengths, np.asarray([len(lengths)]), [runs]).tolist()


def _length_flags(lengths: Sequence[int], runs: Sequence[tuple[int, bool]]) -> bytearray:
    """:func:`flags_from_lengths` of one text as a byte (0 or 1) per token, with list operations (for a few texts,
    where :func:`flags_from_lengths_batch`'s array set-up costs more than the work)."""
    ends = list(itertools.accumulate(lengths))
    num_tokens = len(ends)
    out = bytearray(num_tokens)
    if not num_tokens or not runs:
        return out
    start = 0
    for end, trained in runs:
        if trained and end > start:
            first = bisect.bisect_right(ends, start)  # first token ending after the run starts
            stop = min(bisect.bisect_left(ends, end) + 1, num_tokens)  # past the last token starting before its end
            out[first:stop] = b"\x01" * (stop - first)
        start = end
    if 0 in lengths:  # an empty token (SentencePiece's dummy-prefix "▁" alone) takes the flag at its position
        last = runs[-1][0] - 1
        for i, length in enumerate(lengths):
            if not length:
                position = min(ends[i], last)
                out[i] = next(trained for end, trained in runs if end > position)
    return out


def flags_from_lengths_batch(
    lengths: np.ndarray, counts: np.ndarray, runs: Sequence[Sequence[tuple[int, bool]]]
) -> np.ndarray:
    """:func:`flags_from_lengths` of several texts at once, in array operations over all their tokens.

    Args:
        lengths (np.ndarray): every text's token lengths (UTF-8 bytes), text after text.
        counts (np.ndarray): tokens per text.
        runs (Sequence[Sequence[tuple[int, bool]]]): per text, its ``(end, trainable)`` runs of bytes.

    Returns:
        np.ndarray: bool per token.
    """
    counts = np.asarray(counts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(counts.sum())
    num_texts = len(runs)
    run_counts = np.fromiter(map(len, runs), dtype=np.int64, count=num_texts)
    flat_runs = np.array([run for r in runs for run in r], dtype=np.int64).reshape(-1, 2)
    if not total or not len(flat_runs):
        return np.zeros(total, dtype=np.bool_)
    # the texts' bytes placed one after another: text t starts at base[t]
    has_runs = run_counts > 0
    sizes = np.zeros(num_texts, dtype=np.int64)
    sizes[has_runs] = flat_runs[(np.cumsum(run_counts) - 1)[has_runs], 0]
    base = np.cumsum(sizes) - sizes
    # each token's end in those bytes (a text's tokens start at its base; tokens that would run past their text's
    # end stop there, so that the ends stay in order)
    ends = np.cumsum(lengths)
    first_token = np.cumsum(counts) - counts
    has_tokens = counts > 0
    before = np.zeros(num_texts, dtype=np.int64)  # token bytes before each text's first token
    before[has_tokens] = ends[first_token[has_tokens]] - lengths[first_token[has_tokens]]
    token_sums = np.zeros(num_texts, dtype=np.int64)
    token_sums[has_tokens] = ends[(first_token + counts - 1)[has_tokens]] - before[has_tokens]
    if (base != before).any():
        ends += np.repeat(base - before, counts)
    if (token_sums > sizes).any():
        ends = np.minimum(ends, np.repeat(base + sizes, counts))
    # each run's bytes [run_start, run_end)
    run_text = np.repeat(np.arange(num_texts), run_counts)
    run_end = flat_runs[:, 0] + base[run_text]
    run_start = np.empty_like(run_end)
    run_start[0] = 0
    run_start[1:] = run_end[:-1]
    run_start[(np.cumsum(run_counts) - run_counts)[has_runs]] = base[has_runs]
    run_trained = flat_runs[:, 1].astype(np.bool_)
    # a trained run marks the tokens from the first that ends after its start to the one holding its last byte
    # (within its text): +1 at the first, -1 past the last, and a running sum over the tokens
    chosen = run_trained & (run_end > run_start)
    text_of = run_text[chosen]
    first = np.maximum(np.searchsorted(ends, run_start[chosen], side="right"), first_token[text_of])
    stop = np.minimum(np.searchsorted(ends, run_end[chosen], side="left") + 1, first_token[text_of] + counts[text_of])
    keep = first < stop
    marks = np.bincount(first[keep], minlength=total + 1) - np.bincount(stop[keep], minlength=total + 1)
    trained = np.cumsum(marks[:total]) > 0
    empty = lengths == 0
    if empty.any():  # an empty token (SentencePiece's dummy-prefix "▁" alone) takes the flag of the byte it is at
        last = np.repeat(base + np.maximum(sizes, 1) - 1, counts)
        at = np.minimum(ends[empty], last[empty])
        r = np.minimum(np.searchsorted(run_end, at, side="right"), len(run_end) - 1)
        trained[empty] = run_trained[r]
        trained &= np.repeat(has_runs, counts)
    return trained


def _flags_of_runs(runs: Sequence[tuple[int, bool]]) -> bytearray:
    flags, start = bytearray(), 0
    for end, trained in runs:
        flags.extend(b"\x01" * (end - start) if trained else b"\x00" * (end - start))
        start = end
    return flags


# How a separate segment is encoded: (text) -> (text to encode, number of leading tokens to drop afterwards).
PrepareSeparate = Callable[[str, bool], tuple[str, int]]

# Below this many texts whose flags follow from token lengths, a batch computes them text by text.
_MIN_VECTOR_TEXTS = 32

# Parts of a planned conversation, each ``(kind, a, b, c)``: a special token ``(_SPECIAL, id, trainable, _)``, a
# text with one flag ``(_TEXT, text index, leading tokens to drop, flag byte)``, or a text mixing trained and
# untrained, by offsets ``(_MIXED, mixed index, _, _)`` or by token lengths when the tokenizer knows each token's
# length in the text ``(_MIXED_BY_LENGTHS, text index, runs, _)``.
_SPECIAL, _TEXT, _MIXED, _MIXED_BY_LENGTHS = 0, 1, 2, 3
_FLAG_BYTES = (b"\x00", b"\x01")


def _plan(
    segments: Sequence[Segment],
    special_id: Callable[[str], int],
    rstrip: "frozenset[str]",
    prepare_separate: PrepareSeparate,
    texts: list[str],
    mixed: list[tuple[str, bytearray]],
    by_lengths: bool = False,
) -> list[tuple]:
    """Splits one conversation into parts; texts to encode are appended to ``texts``/``mixed`` (by index)."""
    plan: list[tuple] = []
    chunk: list[Segment] = []
    strip_next = False
    for segment in segments:
        text, trainable, special, separate, trim = segment
        if special:
            if chunk:
                _flush(chunk, plan, texts, mixed, by_lengths)
                chunk = []
            plan.append((_SPECIAL, special_id(text), trainable, None))
            strip_next = bool(rstrip) and text in rstrip
            continue
        if strip_next:
            text = text.lstrip()
            if text is not segment.text:
                segment = Segment(text, trainable)
        if not text:
            continue
        strip_next = False
        if separate:
            if chunk:
                _flush(chunk, plan, texts, mixed, by_lengths)
                chunk = []
            text, drop = prepare_separate(text, trim)
            plan.append((_TEXT, len(texts), drop, _FLAG_BYTES[trainable]))
            texts.append(text)
        else:
            chunk.append(segment)
    if chunk:
        _flush(chunk, plan, texts, mixed, by_lengths)
    return plan


def _flush(chunk: list[Segment], plan: list[tuple], texts: list[str], mixed: list, by_lengths: bool) -> None:
    """Adds the plan part of consecutive text segments (joined: encoded as one text)."""
    first = chunk[0].trainable
    if len(chunk) == 1:
        plan.append((_TEXT, len(texts), 0, _FLAG_BYTES[first]))
        texts.append(chunk[0].text)
        return
    for segment in chunk:
        if segment.trainable != first:
            break
    else:
        plan.append((_TEXT, len(texts), 0, _FLAG_BYTES[first]))
        texts.append("".join([s.text for s in chunk]))
        return
    if by_lengths:
        text, runs = byte_runs(chunk)
        plan.append((_MIXED_BY_LENGTHS, len(texts), runs, None))
        texts.append(text)
    else:
        plan.append((_MIXED, len(mixed), None, None))
        mixed.append(byte_flags(chunk))


def _no_prefix(text: str, trim_leading_whitespace: bool) -> tuple[str, int]:
    return text, 0


class TokenBytes(NamedTuple):
    """How many UTF-8 bytes of a text each token id stands for, for tokenizers whose tokens tile the text (byte-level
    BPE; SentencePiece BPE with identity normalisation), so that the loss mask of a text mixing trained and
    untrained parts follows from the ids alone (:func:`flags_from_lengths_batch`).

    Attributes:
        table (np.ndarray): bytes per token id.
        leading (int): bytes of a text's first token that are not in the text (SentencePiece's dummy-prefix "▁").
        tiles (Callable[[str], bool]): whether a text's tokens tile it; False (a literal "▁", a text that NFC
            normalisation changes) sends the text to the offsets path.
        per_id (Sequence[int] | dict[int, int]): ``table`` as a Python sequence or mapping, for small batches,
            where array operations cost more than they save.
    """

    table: np.ndarray
    leading: int
    tiles: Callable[[str], bool]
    per_id: "Sequence[int] | dict[int, int]"  # the same lengths, for the few texts of a small batch (no numpy)


def token_byte_table(num_bytes: "dict[int, int]") -> np.ndarray:
    """A :class:`TokenBytes` table from ``{token id: bytes}`` (ids missing from it stand for no bytes)."""
    table = np.zeros(max(num_bytes, default=-1) + 1, dtype=np.int64)
    table[np.fromiter(num_bytes.keys(), dtype=np.int64)] = np.fromiter(num_bytes.values(), dtype=np.int64)
    return table


def encode_chunked_batch(
    conversations: Sequence[Sequence[Segment]],
    special_id: Callable[[str], int],
    encode_batch: Callable[[list[str]], list[list[int]]],
    encode_with_offsets_batch: Callable[[list[str]], list[tuple[list[int], list[tuple[int, int]]]]],
    rstrip: "frozenset[str]" = frozenset(),
    prepare_separate: PrepareSeparate = _no_prefix,
    token_bytes: TokenBytes | None = None,
) -> list[tuple[list[int], list[bool]]]:
    """:func:`encode_chunked_flat`, one ``(tokens, trainable)`` pair of lists per conversation."""
    return encode_chunked_flat(
        conversations, special_id, encode_batch, encode_with_offsets_batch, rstrip, prepare_separate, token_bytes
    ).split()


class FlatEncoding(NamedTuple):
    """Several encoded conversations end to end: what datasets store, without a Python list per conversation.

    Attributes:
        tokens (array.array): all token ids (``"i"``: int32), conversation after conversation.
        trainable (bytearray): one byte per token, 1 where the token gets a loss.
        lengths (list[int]): tokens per conversation.
    """

    tokens: array.array
    trainable: bytearray
    lengths: list[int]

    def split(self) -> list[tuple[list[int], list[bool]]]:
        """One ``(tokens, trainable)`` pair of lists per conversation."""
        out, start = [], 0
        for length in self.lengths:
            end = start + length
            out.append((self.tokens[start:end].tolist(), list(map(bool, self.trainable[start:end]))))
            start = end
        return out

    @classmethod
    def join(cls, encoded: Sequence[tuple[Sequence[int], Sequence[bool]]]) -> "FlatEncoding":
        """The flat form of ``(tokens, trainable)`` pairs."""
        tokens, trainable, lengths = array.array("i"), bytearray(), []
        for ids, flags in encoded:
            tokens.extend(ids)
            trainable.extend(map(bool, flags))
            lengths.append(len(ids))
        return cls(tokens, trainable, lengths)


def encode_chunked_flat(
    conversations: Sequence[Sequence[Segment]],
    special_id: Callable[[str], int],
    encode_batch: Callable[[list[str]], list[list[int]]],
    encode_with_offsets_batch: Callable[[list[str]], list[tuple[list[int], list[tuple[int, int]]]]],
    rstrip: "frozenset[str]" = frozenset(),
    prepare_separate: PrepareSeparate = _no_prefix,
    token_bytes: TokenBytes | None = None,
) -> FlatEncoding:
    """Encodes rendered conversations for tokenizers that split the text at special tokens first (SentencePiece,
    tiktoken), with one batch call to the backend for all the texts of all the conversations.

    Special segments become their id; the text between two special tokens is encoded in one piece, exactly as
    Hugging Face tokenizers encode the pieces between added tokens, and each token is trained when it overlaps
    a trained segment. A ``separate`` segment is encoded on its own (``prepare_separate`` may prefix it with text
    whose tokens are then dropped). Whitespace right after a special token named in ``rstrip`` is dropped, as
    Hugging Face does for added tokens marked ``rstrip`` (Phi-3's ``<|user|>``, ``<|end|>``, ...). Offsets (UTF-8
    byte spans) are only computed for chunks that mix trained and untrained text; with ``token_bytes`` (each
    token's length in UTF-8 bytes, for tokenizers whose tokens tile the text) such chunks are encoded with
    ``encode_batch`` like the others and the flags follow from the lengths, for the whole batch at once
    (:func:`flags_from_lengths_batch`).

    Returns:
        FlatEncoding: the conversations' tokens and trainable flags, end to end.
    """
    texts: list[str] = []
    mixed: list[tuple[str, bytearray]] = []
    special_ids: dict[str, int] = {}

    def cached_special_id(token: str) -> int:  # a handful of distinct special tokens, looked up per conversation
        if token not in special_ids:
            special_ids[token] = special_id(token)
        return special_ids[token]

    by_lengths = token_bytes is not None
    plans = [
        _plan(segments, cached_special_id, rstrip, prepare_separate, texts, mixed, by_lengths)
        for segments in conversations
    ]
    encoded = encode_batch(texts) if texts else []
    mixed_encoded = encode_with_offsets_batch([text for text, _ in mixed]) if mixed else []
    tokens: list[int] = []  # one conversion to an array at the end: extending an array converts id by id, slower
    trainable, lengths = bytearray(), []
    by_length_at: list[int] = []  # first token of each text whose flags follow from token lengths
    by_length_counts: list[int] = []
    by_length_runs: list = []
    for plan in plans:
        start = len(tokens)
        for kind, a, b, c in plan:
            if kind == _SPECIAL:
                tokens.append(a)
                trainable.append(b)
            elif kind == _TEXT:
                ids = encoded[a][b:] if b else encoded[a]
                tokens.extend(ids)
                trainable += c * len(ids)
            elif kind == _MIXED_BY_LENGTHS:
                ids = encoded[a]
                if token_bytes.tiles(texts[a]):  # flags for the whole batch after this loop
                    by_length_at.append(len(tokens))
                    by_length_counts.append(len(ids))
                    by_length_runs.append(b)
                    trainable += bytes(len(ids))
                else:  # the tokens do not tile this text: take the offsets
                    _, offsets = encode_with_offsets_batch([texts[a]])[0]
                    trainable.extend(token_flags(offsets, _flags_of_runs(b)))
                tokens.extend(ids)
            else:
                ids, offsets = mixed_encoded[a]
                tokens.extend(ids)
                trainable.extend(token_flags(offsets, mixed[a][1]))
        lengths.append(len(tokens) - start)
    token_array = array.array("i", tokens)
    if by_length_at and len(by_length_at) < _MIN_VECTOR_TEXTS:  # a few texts: array set-up would dominate
        per_id, leading = token_bytes.per_id, token_bytes.leading
        for at, count, runs in zip(by_length_at, by_length_counts, by_length_runs):
            token_lengths = [per_id[i] for i in tokens[at : at + count]]
            if token_lengths and leading:
                token_lengths[0] -= leading
            trainable[at : at + count] = _length_flags(token_lengths, runs)
    elif by_length_at:
        counts = np.asarray(by_length_counts, dtype=np.int64)
        at = np.asarray(by_length_at, dtype=np.int64)
        index = np.repeat(at - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        token_lengths = token_bytes.table[np.frombuffer(token_array, dtype=np.int32)[index]]
        if token_bytes.leading:
            nonempty = counts > 0
            token_lengths[(np.cumsum(counts) - counts)[nonempty]] -= token_bytes.leading
        flags = flags_from_lengths_batch(token_lengths, counts, by_length_runs)
        np.frombuffer(trainable, dtype=np.uint8)[index] = flags
    return FlatEncoding(token_array, trainable, lengths)


class TokenizerFileError(TuneError, ValueError):
    """A tokenizer file that cannot be read as the kind of tokenizer asked for; the message names the file."""


class TokenizerFileNotFoundError(TokenizerFileError, FileNotFoundError):
    """A tokenizer file that does not exist (or is a directory where a file was expected)."""


def require_file(path: "str | Path", what: str, hint: str) -> Path:
    """Returns ``path`` as a Path, or raises TokenizerFileNotFoundError naming what was expected and how to get it."""
    path = Path(path).expanduser()
    if not path.is_file():
        found = "is a directory" if path.is_dir() else "not found"
        raise TokenizerFileNotFoundError(f"{what} {found} at {str(path)!r}. {hint}")
    return path


def unreadable_file(path: "str | Path", what: str, error: BaseException, hint: str) -> TokenizerFileError:
    """The error for a tokenizer file that exists but does not load (``error`` is what the loader said)."""
    said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return TokenizerFileError(f"{str(path)!r} is not a valid {what} ({said}). {hint}")


def read_json_file(path: "str | Path", what: str) -> dict:
    """Reads a tokenizer's JSON file (tokenizer_config.json, tokenizer.json's added tokens), naming it on error."""
    return utils.read_json_file(
        path, what, error=TokenizerFileError, fix="copy the file from the model's repository again"
    )
