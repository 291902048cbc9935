"""Helpers shared by the text tokenizers: truncation and turning rendered segments into tokens plus flags."""

from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from tune.data._chat_formats import Segment

# (token ids, [(start, end)] UTF-8 byte offsets of each token in the text)
EncodeWithOffsets = Callable[[str], tuple[list[int], list[tuple[int, int]]]]


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
    last = len(flags) - 1
    if last < 0:
        return [False] * len(offsets)
    find = flags.find
    out = []
    for k, (start, end) in enumerate(offsets):
        if end <= start or (atomic and ids[k] in atomic):
            out.append(flags[min(start, last)] == 1)
        else:
            out.append(find(1, start, end) >= 0)
    return out


def encode_chunked(
    segments: Sequence[Segment],
    special_id: Callable[[str], int],
    encode: Callable[[str], list[int]],
    encode_with_offsets: EncodeWithOffsets,
    rstrip: "frozenset[str]" = frozenset(),
) -> tuple[list[int], list[bool]]:
    """Encodes segments for tokenizers that split the text at special tokens first (SentencePiece, tiktoken).

    Special segments become their id; the text between two special tokens is encoded in one call, exactly as
    Hugging Face tokenizers encode the pieces between added tokens, and each token is trained when it overlaps
    a trained segment. Whitespace right after a special token named in ``rstrip`` is dropped, as Hugging Face
    does for added tokens marked ``rstrip`` (Phi-3's ``<|user|>``, ``<|end|>``, ...). Offsets (UTF-8 byte spans)
    are only computed for chunks that mix trained and untrained text.
    """
    tokens: list[int] = []
    trainable: list[bool] = []
    chunk: list[Segment] = []

    def flush() -> None:
        if not chunk:
            return
        if all(s.trainable == chunk[0].trainable for s in chunk):
            ids = encode("".join(s.text for s in chunk))
            tokens.extend(ids)
            trainable.extend([chunk[0].trainable] * len(ids))
        else:
            text, flags = byte_flags(chunk)
            ids, offsets = encode_with_offsets(text)
            tokens.extend(ids)
            trainable.extend(token_flags(offsets, flags))
        chunk.clear()

    strip_next = False
    for segment in segments:
        if segment.special:
            flush()
            tokens.append(special_id(segment.text))
            trainable.append(segment.trainable)
            strip_next = segment.text in rstrip
        elif strip_next:
            text = segment.text.lstrip()
            if text:
                chunk.append(Segment(text, segment.trainable))
                strip_next = False
        else:
            chunk.append(segment)
    flush()
    return tokens, trainable


def require_file(path: "str | Path", what: str, hint: str) -> Path:
    """Returns ``path`` as a Path, or raises FileNotFoundError naming what was expected and how to get it."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {str(path)!r}. {hint}")
    return path
