"""Renders one training sample as text with the trained spans marked (``tune validate --show-sample N``)."""

from collections.abc import Callable, Sequence
from itertools import groupby

TRAIN_START = "[["
TRAIN_END = "]]"


def render_sample(
    tokens: Sequence[int],
    trained: Sequence[bool],
    decode: Callable[[list[int]], str],
    *,
    start: str = TRAIN_START,
    end: str = TRAIN_END,
) -> str:
    """Decodes ``tokens`` to text and wraps every run of trained tokens in ``start`` ... ``end``.

    Each run is decoded as the difference between the decoded prefixes before and after it, so tokenizers that
    drop or merge leading spaces at a cut (SentencePiece) render the text as it reads in one piece.

    Args:
        tokens (Sequence[int]): the sample's token ids.
        trained (Sequence[bool]): per token, whether it is trained (its label is not the ignore index).
        decode (Callable[[list[int]], str]): token ids -> text.
        start (str): marker opening a trained span.
        end (str): marker closing a trained span.

    Returns:
        str: a header line (token counts, the markers) and the marked text.

    Raises:
        ValueError: when ``tokens`` and ``trained`` differ in length.
    """
    tokens, trained = list(tokens), [bool(t) for t in trained]
    if len(tokens) != len(trained):
        raise ValueError(f"tokens and trained differ in length: {len(tokens)} != {len(trained)}")
    pieces, done, previous = [], 0, ""
    for is_trained, run in groupby(trained):
        stop = done + len(list(run))
        text = decode(tokens[:stop])
        piece = text[len(previous) :] if text.startswith(previous) else decode(tokens[done:stop])
        pieces.append(f"{start}{piece}{end}" if is_trained else piece)
        done, previous = stop, text
    header = f"{len(tokens)} tokens, {sum(trained)} trained (shown between {start} and {end})"
    return header + "\n" + "".join(pieces)
