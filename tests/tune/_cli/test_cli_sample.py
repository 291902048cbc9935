"""tune/_cli/_sample.py: a sample rendered as text with its trained spans marked."""

import pytest

from tune._cli._sample import render_sample


def _chars(ids):
    return "".join(chr(i) for i in ids)


def test_trained_runs_are_wrapped_in_markers():
    text = "Q: hi A: hello</s>"
    tokens = [ord(c) for c in text]
    trained = [False] * 9 + [True] * 9  # the response "hello</s>" is trained, the prompt is not
    assert (
        render_sample(tokens, trained, _chars)
        == "18 tokens, 9 trained (shown between [[ and ]])\nQ: hi A: [[hello</s>]]"
    )


def test_several_runs_and_custom_markers():
    tokens = [ord(c) for c in "abcdef"]
    out = render_sample(tokens, [True, False, False, True, True, False], _chars, start="<", end=">")
    assert out.splitlines()[1] == "<a>bc<de>f"


def test_pieces_come_from_decoded_prefixes_so_cut_spaces_survive():
    # a SentencePiece-like decoder drops the leading space of the first piece it decodes
    vocab = {1: " Hello", 2: " world", 3: "!"}

    def decode(ids):
        return "".join(vocab[i] for i in ids).lstrip(" ")

    out = render_sample([1, 2, 3], [False, True, True], decode).splitlines()[1]
    assert out == "Hello[[ world!]]"  # decoding [2, 3] alone would have lost the space before "world"


def test_lengths_must_match():
    with pytest.raises(ValueError, match="3 != 2"):
        render_sample([1, 2, 3], [True, False], _chars)
