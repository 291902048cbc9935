"""Conversations with images through a text chat format (tune.data._media): the image segments land where the
image parts were, are never trained, and the text around them tokenises as the Hugging Face processor's does
(text split at special tokens)."""

import pytest
from PIL import Image

from tests.tune.data._tiny_tokenizers import qwen_tokenizer_json
from tune.data import IMAGE_PLACEHOLDER, Message, Segment, insert_image_segments, replace_images, tokenize_with_images
from tune.models.qwen2_5 import qwen2_5_tokenizer

transformers = pytest.importorskip("transformers")


def _image(colour: str) -> Image.Image:
    return Image.new("RGB", (4, 4), colour)


def _pads(count: int):
    return lambda i: [
        Segment("<|vision_start|>", True, special=True),
        *[Segment("<|image_pad|>", True, special=True)] * (count + i),
        Segment("<|vision_end|>", True, special=True),
    ]


def test_replace_images_keeps_order_and_flags():
    red, blue = _image("red"), _image("blue")
    messages = [
        Message("user", [{"type": "image", "content": red}, {"type": "text", "content": " two "},
                         {"type": "image", "content": blue}], masked=True),
        Message("assistant", "ok"),
    ]  # fmt: skip
    converted, images = replace_images(messages, strip_text=True)
    assert images == [red, blue]
    assert converted[0].text_content == f"{IMAGE_PLACEHOLDER}two{IMAGE_PLACEHOLDER}"
    assert converted[0].masked and converted[1] is messages[1]


def test_placeholder_in_text_is_refused():
    with pytest.raises(ValueError, match="U\\+E000"):
        replace_images([Message("user", f"a{IMAGE_PLACEHOLDER}b")])


def test_inserted_segments_are_not_trained():
    segments = [Segment(f"see {IMAGE_PLACEHOLDER} now", True)]
    out = insert_image_segments(segments, lambda i: [Segment("<img>", True, special=True)])
    assert [(s.text, s.trainable, s.special) for s in out] == [
        ("see ", True, False), ("<img>", False, True), (" now", True, False)
    ]  # fmt: skip


def test_tokens_equal_hf_tokenizer_on_the_expanded_text():
    path = qwen_tokenizer_json() / "tokenizer.json"
    tokenizer = qwen2_5_tokenizer(str(path))
    messages = [
        Message("user", [{"type": "text", "content": "What is"}, {"type": "image", "content": _image("red")},
                         {"type": "text", "content": "and this"}, {"type": "image", "content": _image("blue")}],
                masked=True),
        Message("assistant", "Two squares."),
    ]  # fmt: skip
    tokens, mask, images = tokenize_with_images(tokenizer, messages, _pads(2))
    assert len(images) == 2
    pads = lambda n: "<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>"  # noqa: E731
    text_messages = [
        {"role": "user", "content": f"What is{pads(2)}and this{pads(3)}", "masked": True},
        {"role": "assistant", "content": "Two squares."},
    ]
    expected, expected_mask = tokenizer.tokenize_messages([Message.from_dict(m) for m in text_messages])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    expected_hf = hf(tokenizer.decode(expected, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
    assert tokens == expected == expected_hf
    pad_id = tokenizer.tokenizer.token_id("<|image_pad|>")
    assert [t for t in tokens if t == pad_id] == [pad_id] * 5
    assert all(m for t, m in zip(tokens, mask) if t == pad_id)
    assert mask == expected_mask and not all(mask)  # the masked user turn, the trained answer
