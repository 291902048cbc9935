"""Helpers shared by the text tokenizers: truncation and turning rendered segments into tokens plus flags."""

from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np

from tune.data._chat_formats import Segment


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


# How a separate segment is encoded: (text) -> (text to encode, number of leading tokens to drop afterwards).
PrepareSeparate = Callable[[str, bool], tuple[str, int]]

# Parts of a planned conversation: a special token, a text with one flag, or a text mixing trained and untrained.
_SPECIAL, _TEXT, _MIXED = 0, 1, 2


def _plan(
    segments: Sequence[Segment],
    special_id: Callable[[str], int],
    rstrip: "frozenset[str]",
    prepare_separate: PrepareSeparate,
    texts: list[str],
    mixed: list[tuple[str, bytearray]],
) -> list[tuple]:
    """Splits one conversation into parts; texts to encode are appended to ``texts``/``mixed`` (by index)."""
    plan: list[tuple] = []
    chunk: list[Segment] = []

    def flush() -> None:
        if not chunk:
            return
        if all(s.trainable == chunk[0].trainable for s in chunk):
            plan.append((_TEXT, len(texts), chunk[0].trainable, 0))
            texts.append("".join(s.text for s in chunk))
        else:
            plan.append((_MIXED, len(mixed)))
            mixed.append(byte_flags(chunk))
        chunk.clear()

    strip_next = False
    for segment in segments:
        if segment.special:
            flush()
            plan.append((_SPECIAL, special_id(segment.text), segment.trainable))
            strip_next = segment.text in rstrip
            continue
        text = segment.text.lstrip() if strip_next else segment.text
        if not text:
            continue
        strip_next = False
        if segment.separate:
            flush()
            text, drop = prepare_separate(text, segment.trim_leading_whitespace)
            plan.append((_TEXT, len(texts), segment.trainable, drop))
            texts.append(text)
        else:
            chunk.append(segment if text is segment.text else Segment(text, segment.trainable))
    flush()
    return plan


def _no_prefix(text: str, trim_leading_whitespace: bool) -> tuple[str, int]:
    return text, 0


def encode_chunked_batch(
    conversations: Sequence[Sequence[Segment]],
    special_id: Callable[[str], int],
    encode_batch: Callable[[list[str]], list[list[int]]],
    encode_with_offsets_batch: Callable[[list[str]], list[tuple[list[int], list[tuple[int, int]]]]],
    rstrip: "frozenset[str]" = frozenset(),
    prepare_separate: PrepareSeparate = _no_prefix,
) -> list[tuple[list[int], list[bool]]]:
    """Encodes rendered conversations for tokenizers that split the text at special tokens first (SentencePiece,
    tiktoken), with one batch call to the backend for all the texts of all the conversations.

    Special segments become their id; the text between two special tokens is encoded in one piece, exactly as
    Hugging Face tokenizers encode the pieces between added tokens, and each token is trained when it overlaps
    a trained segment. A ``separate`` segment is encoded on its own (``prepare_separate`` may prefix it with text
    whose tokens are then dropped). Whitespace right after a special token named in ``rstrip`` is dropped, as
    Hugging Face does for added tokens marked ``rstrip`` (Phi-3's ``<|user|>``, ``<|end|>``, ...). Offsets (UTF-8
    byte spans) are only computed for chunks that mix trained and untrained text.

    Returns:
        list[tuple[list[int], list[bool]]]: ``(tokens, trainable)`` per conversation.
    """
    texts: list[str] = []
    mixed: list[tuple[str, bytearray]] = []
    special_ids: dict[str, int] = {}

    def cached_special_id(token: str) -> int:  # a handful of distinct special tokens, looked up per conversation
        if token not in special_ids:
            special_ids[token] = special_id(token)
        return special_ids[token]

    plans = [_plan(segments, cached_special_id, rstrip, prepare_separate, texts, mixed) for segments in conversations]
    encoded = encode_batch(texts) if texts else []
    mixed_encoded = encode_with_offsets_batch([text for text, _ in mixed]) if mixed else []
    results = []
    for plan in plans:
        tokens: list[int] = []
        trainable: list[bool] = []
        for part in plan:
            if part[0] == _SPECIAL:
                tokens.append(part[1])
                trainable.append(part[2])
            elif part[0] == _TEXT:
                ids = encoded[part[1]][part[3] :] if part[3] else encoded[part[1]]
                tokens.extend(ids)
                trainable.extend([part[2]] * len(ids))
            else:
                ids, offsets = mixed_encoded[part[1]]
                tokens.extend(ids)
                trainable.extend(token_flags(offsets, mixed[part[1]][1]))
        results.append((tokens, trainable))
    return results


def require_file(path: "str | Path", what: str, hint: str) -> Path:
    """Returns ``path`` as a Path, or raises FileNotFoundError naming what was expected and how to get it."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {str(path)!r}. {hint}")
    return path
