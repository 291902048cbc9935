"""Render a tokenized sample as text with its trained spans marked, to check a loss mask by eye."""

from collections.abc import Callable, Sequence

from tune.data._common import CROSS_ENTROPY_IGNORE_IDX

_ANSI_GREEN = "\033[32m"
_ANSI_RESET = "\033[0m"


def _trained_flags(tokens: Sequence[int], labels_or_mask: Sequence) -> list[bool]:
    values = labels_or_mask.tolist() if hasattr(labels_or_mask, "tolist") else list(labels_or_mask)
    if len(values) != len(tokens):
        raise ValueError(f"Got {len(tokens)} tokens but {len(values)} labels/mask entries; they must match.")
    if values and all(isinstance(v, bool) for v in values):
        return [not v for v in values]  # a mask: True means "no loss"
    return [int(v) != CROSS_ENTROPY_IGNORE_IDX for v in values]


def render_sample(
    tokens: Sequence[int],
    labels_or_mask: Sequence,
    decode: Callable[[list[int]], str],
    *,
    start_marker: str = "[[",
    end_marker: str = "]]",
    color: bool = False,
) -> str:
    """Decodes a sample and marks the tokens that get loss.

    Consecutive tokens with the same status are decoded together, so a trained span reads as text:
    ``"<s>Question? [[The answer.</s>]]"``. Each span is the difference between the decoded prefixes before and
    after it, so tokenizers that drop a leading space at a cut (SentencePiece) render the text as it reads whole.

    Args:
        tokens (Sequence[int]): token ids (list or 1-D tensor).
        labels_or_mask (Sequence): either labels (trained where not ``-100``) or a bool mask as returned by
            ``tokenize_messages`` (True = masked, no loss).
        decode (Callable[[list[int]], str]): ids to text, e.g.
            ``lambda ids: tokenizer.decode(ids, skip_special_tokens=False)``.
        start_marker (str): inserted before each trained span. Default ``"[["``.
        end_marker (str): inserted after each trained span. Default ``"]]"``.
        color (bool): also colour trained spans green with ANSI escapes (for a terminal).

    Returns:
        str: the rendered text.

    Raises:
        ValueError: when tokens and labels differ in length.
    """
    ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
    flags = _trained_flags(ids, labels_or_mask)
    pieces: list[str] = []
    start, previous = 0, ""
    for i in range(1, len(ids) + 1):
        if i < len(ids) and flags[i] == flags[start]:
            continue
        prefix = decode(ids[:i])
        text = prefix[len(previous) :] if prefix.startswith(previous) else decode(ids[start:i])
        if flags[start]:
            text = f"{start_marker}{text}{end_marker}"
            if color:
                text = f"{_ANSI_GREEN}{text}{_ANSI_RESET}"
        pieces.append(text)
        start, previous = i, prefix
    return "".join(pieces)
