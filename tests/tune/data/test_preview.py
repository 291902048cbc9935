import pytest
import torch

from tune.data import render_sample


def _decode(ids):
    return "".join(chr(i) for i in ids)


def test_marks_trained_spans_from_labels():
    tokens = [ord(c) for c in "Q: hi A: yo"]
    labels = [-100] * 9 + tokens[9:]  # "Q: hi A: " is 9 characters
    assert render_sample(tokens, labels, _decode) == "Q: hi A: [[yo]]"


def test_accepts_a_bool_mask_and_tensors():
    tokens = torch.tensor([ord(c) for c in "abcd"])
    mask = [False, True, True, False]  # True = masked, as tokenize_messages returns it
    assert render_sample(tokens, mask, _decode) == "[[a]]bc[[d]]"


def test_colour_and_custom_markers():
    out = render_sample([97, 98], [-100, 98], _decode, start_marker="<", end_marker=">", color=True)
    assert out == "a\033[32m<b>\033[0m"


def test_length_mismatch():
    with pytest.raises(ValueError, match="2 tokens but 1"):
        render_sample([1, 2], [1], _decode)


def test_spans_come_from_decoded_prefixes_so_cut_spaces_survive():
    # a SentencePiece-like decoder drops the leading space of the first piece it decodes
    vocab = {1: " Hello", 2: " world", 3: "!"}

    def decode(ids):
        return "".join(vocab[i] for i in ids).lstrip(" ")

    out = render_sample([1, 2, 3], [-100, 2, 3], decode)
    assert out == "Hello[[ world!]]"  # decoding [2, 3] alone would have lost the space before "world"
