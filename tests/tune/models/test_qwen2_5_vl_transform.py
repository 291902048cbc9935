"""Qwen2.5-VL's image transform and model transform (tune/models/qwen2_5_vl/_transform.py) against transformers:
``smart_resize`` against transformers' function, pixel values and grids against ``Qwen2VLImageProcessorPil`` on
images of many sizes, aspect ratios and modes, and whole samples (tokens, pixel values, grids) against
``Qwen2_5_VLProcessor`` on conversations rendered by the Qwen2.5-VL chat template. The loss mask trains exactly the
assistant turns' text; truncation never leaves part of an image. The tokenizer is the tiny Qwen one of
tests/tune/data/_tiny_tokenizers.py; images are seeded random noise, on which any difference in resizing shows."""

import functools
import logging
import random

import numpy as np
import pytest
import torch

from tests.tune.data._tiny_tokenizers import qwen_tokenizer_json, trained_runs
from tune.data import Message, mask_messages
from tune.models.qwen2_5_vl import (
    Qwen2_5_VLImageTransform,
    Qwen2_5_VLTransform,
    qwen2_5_vl_transform,
    smart_resize,
)

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor  # noqa: E402
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_pil  # noqa: E402

# The chat template of Qwen/Qwen2.5-VL-7B-Instruct (its chat_template.json; Qwen2-VL's is the same), written here
# from knowledge of the release, since nothing can be downloaded in the tests.
QWEN2_5_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A small pixel budget keeps the conversations short: from 4 to 25 image tokens per image.
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 100
TOLERANCE = 1e-5


class _ReferenceProcessor(Qwen2_5_VLProcessor):
    """transformers' processor, unchanged but for its constructor's class check of the video processor, which
    needs torchvision (not installed) to name the class; no video is processed here."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def _tokenizer_file() -> str:
    return str(qwen_tokenizer_json() / "tokenizer.json")


@functools.cache
def _reference(min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> Qwen2_5_VLProcessor:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=_tokenizer_file(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    image_processor = hf_pil.Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    return _ReferenceProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN2_5_VL_TEMPLATE)


@functools.cache
def _ours(max_seq_len: int | None = None, add_vision_id: bool = False) -> Qwen2_5_VLTransform:
    return qwen2_5_vl_transform(
        _tokenizer_file(),
        max_seq_len=max_seq_len,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        add_vision_id=add_vision_id,
    )


def _noise(height: int, width: int, mode: str = "RGB", seed: int = 0):
    """A seeded random image of ``height x width`` pixels in ``mode``."""
    rng = np.random.default_rng(seed)
    if mode == "RGBA":
        return Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    if mode == "LA":
        return Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").convert("LA")
    if mode in ("P", "P+transparency"):
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).quantize(16)
        if mode == "P+transparency":
            image.info["transparency"] = 3  # palette entry 3 is transparent
        return image
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)


# ---- smart_resize -------------------------------------------------------------------------------------------------


def test_smart_resize_matches_transformers():
    rng = random.Random(0)
    # every side from 1 to 120 (halves of 28 included: round() goes to even there), then random sizes up to 4000
    sizes = [(h, w) for h in range(1, 121, 7) for w in range(1, 121, 3)]
    sizes += [(rng.randint(1, 4000), rng.randint(1, 4000)) for _ in range(400)]
    sizes += [(14, 14), (42, 42), (70, 98), (1, 200), (200, 1), (3, 599), (4000, 20)]
    budgets = [
        (56 * 56, 28 * 28 * 1280),
        (MIN_PIXELS, MAX_PIXELS),
        (56 * 56, 28 * 28 * 16384),
        (28 * 28 * 4, 28 * 28 * 8),
    ]
    checked = 0
    for height, width in sizes:
        if max(height, width) / min(height, width) > 200:
            continue
        for min_pixels, max_pixels in budgets:
            expected = hf_pil.smart_resize(height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
            assert smart_resize(height, width, 28, min_pixels, max_pixels) == tuple(expected), (height, width)
            checked += 1
    assert checked > 2000
    assert smart_resize(123, 457) == tuple(hf_pil.smart_resize(123, 457))  # the same defaults


@pytest.mark.parametrize("height, width", [(1, 201), (201, 1), (10, 2001), (3000, 14)])
def test_smart_resize_refuses_extreme_aspect_ratios_as_transformers_does(height, width):
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_pil.smart_resize(height, width)
    with pytest.raises(ValueError, match=r"aspect ratio of [\d.]+; Qwen2.5-VL takes aspect ratios up to 200"):
        smart_resize(height, width)


@pytest.mark.parametrize("height, width", [(0, 5), (5, 0), (0, 0)])
def test_smart_resize_refuses_empty_images(height, width):
    with pytest.raises(ValueError, match="at least one pixel"):
        smart_resize(height, width)


# ---- the image transform ------------------------------------------------------------------------------------------

# (height, width, mode, (min_pixels, max_pixels)): tiny images grown to the minimum, thin ones, sides on a rounding
# tie, big ones shrunk to the maximum, every common PIL mode; the default budget is the released checkpoints'.
IMAGES = [
    (1, 1, "RGB", None),
    (1, 150, "RGB", None),
    (150, 1, "RGB", None),
    (13, 17, "RGB", None),
    (28, 28, "RGB", None),
    (42, 70, "RGB", None),
    (56, 56, "RGB", None),
    (100, 30, "RGB", None),
    (37, 251, "RGB", None),
    (300, 200, "RGB", None),
    (481, 640, "RGB", None),
    (900, 1200, "RGB", (MIN_PIXELS, 28 * 28 * 64)),
    (333, 517, "RGB", (MIN_PIXELS, MAX_PIXELS)),
    (1000, 7, "RGB", (MIN_PIXELS, MAX_PIXELS)),
    (64, 96, "RGB", (28 * 28 * 40, 28 * 28 * 80)),
    (50, 80, "RGBA", None),
    (61, 45, "L", None),
    (45, 61, "LA", None),
    (70, 33, "P", None),
    (33, 70, "P+transparency", None),
    (40, 40, "CMYK", None),
    (57, 43, "1", None),
    (99, 101, "I", None),
]


@pytest.mark.parametrize("index, height, width, mode, budget", [(i, *case) for i, case in enumerate(IMAGES)])
def test_image_transform_matches_transformers_pil_processor(index, height, width, mode, budget):
    image = _noise(height, width, mode, seed=index)
    # no budget: ours defaults to the release's (its preprocessor_config.json), which the processor class lacks
    min_pixels, max_pixels = budget or (56 * 56, 28 * 28 * 16384)
    processor = hf_pil.Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    expected = processor(images=[image], return_tensors="pt")
    transform = Qwen2_5_VLImageTransform(
        **({} if budget is None else {"min_pixels": min_pixels, "max_pixels": max_pixels})
    )
    pixel_values, grid = transform(image)
    assert grid.dtype == torch.int64 and grid.tolist() == expected["image_grid_thw"][0].tolist()
    assert pixel_values.dtype == torch.float32 and pixel_values.shape == expected["pixel_values"].shape
    assert (pixel_values - expected["pixel_values"]).abs().max().item() <= TOLERANCE
    assert transform.grid_thw(image) == tuple(grid.tolist())
    assert transform.num_image_tokens(image) == grid.prod().item() // 4 == pixel_values.shape[0] // 4


def test_image_transform_errors():
    transform = Qwen2_5_VLImageTransform()
    with pytest.raises(TypeError, match=r"must be a PIL.Image.Image, got str; open files with PIL.Image.open"):
        transform("cat.png")
    with pytest.raises(TypeError, match="got Tensor"):
        transform(torch.zeros(3, 28, 28))
    with pytest.raises(ValueError, match="aspect ratio of 250.0"):
        transform(Image.new("RGB", (500, 2)))
    with pytest.raises(ValueError, match="at least one pixel"):
        transform(Image.new("RGB", (0, 5)))
    with pytest.raises(ValueError, match=r"min_pixels \(5000\) must not exceed max_pixels \(4000\)"):
        Qwen2_5_VLImageTransform(min_pixels=5000, max_pixels=4000)
    with pytest.raises(ValueError, match="patch_size must be a positive integer"):
        Qwen2_5_VLImageTransform(patch_size=0)
    with pytest.raises(ValueError, match="3 numbers"):
        Qwen2_5_VLImageTransform(image_mean=(0.5, 0.5))


# ---- the model transform against the processor --------------------------------------------------------------------

# A pool of images small enough for short conversations, of different shapes.
POOL = [(30, 40), (64, 64), (20, 100), (100, 20), (57, 83), (5, 5), (120, 90), (28, 56)]

# Conversations as (role, content) with content a string or a list of strings and image indices into POOL.
CONVERSATIONS = [
    # text only, with and without a system prompt
    [("user", "What is the capital of France?"), ("assistant", "Paris.")],
    [("system", "You are a tune model."), ("user", "Hello world!"), ("assistant", "Hi, how can I help?")],
    # one image, before, after and inside the text
    [("user", [0, "What is this?"]), ("assistant", "A fox.")],
    [("user", ["Describe", 1]), ("assistant", "A dog over a river bank.")],
    [("user", ["Look at ", 2, " and explain."]), ("assistant", "The quick brown fox jumps.")],
    [("system", "Answer in one line."), ("user", [3, "what is it?"]), ("assistant", "A city.")],
    # several images in one turn, side by side and between texts
    [("user", [0, 1, "Compare them."]), ("assistant", "The first is wider.")],
    [("user", ["one", 4, "two", 5, "three", 6]), ("assistant", "1 2 3")],
    [("system", "Be brief."), ("user", [7, 7, 0, "Same or not?"]), ("assistant", "Two are the same.")],
    # images in several turns, multi-turn
    [("user", [0, "What?"]), ("assistant", "A cat."), ("user", [1, "And this?"]), ("assistant", "A dog.")],
    [
        ("system", "You are a helpful assistant. Answer in one line."),
        ("user", [2, "Why?\n\n  café 42"]),
        ("assistant", "2024: the quick brown fox!\n\nOne two three."),
        ("user", "Please explain, no image."),
        ("assistant", "Because."),
        ("user", [3, 4, " last one "]),
        ("assistant", " naïve answer "),
    ],
    # an image in the system prompt, and an answer that holds an image
    [("system", ["Reference:", 5]), ("user", [6, "Which?"]), ("assistant", "The second.")],
    [("user", "Draw it."), ("assistant", ["Here:", 7, " done."])],
    # an image alone, no text in the turn
    [("user", [1]), ("assistant", "A square.")],
    [("user", [0, 2]), ("assistant", "Two images."), ("user", [3]), ("assistant", "One more.")],
    # several text parts without images, whitespace and newlines around images
    [("user", ["Hello ", "world", "!"]), ("assistant", "Hi.")],
    [("user", ["\n", 4, "\n\nwhat is this\n"]), ("assistant", "\nA thing.\n")],
    # a tool result: its own turn in this template (Qwen 2.5's folds it into a user turn)
    [
        ("user", [5, "Search it."]),
        ("assistant", "<tool_call>search</tool_call>"),
        ("tool", "found 3"),
        ("assistant", "3."),
    ],
    # a big image among small ones
    [("user", [6, "and", 2, 1]), ("assistant", "Three pictures.")],
    # long multi-turn text
    [
        ("user", "one two three"),
        ("assistant", "four five"),
        ("user", [7, "six"]),
        ("assistant", "seven"),
        ("user", "eight"),
        ("assistant", "nine ten"),
    ],  # fmt: skip
    [("system", "Short."), ("user", [0, 1, 2, 3]), ("assistant", "Four images: a, b, c, d.")],
]


def _images():
    return [_noise(h, w, seed=100 + i) for i, (h, w) in enumerate(POOL)]


def _build(conversation, images):
    """Our messages (masked as the default strategy masks them) and transformers' message dicts."""
    messages, dicts = [], []
    for role, content in conversation:
        if isinstance(content, str):
            messages.append(Message(role, content))
            dicts.append({"role": role, "content": content})
            continue
        parts, hf_parts = [], []
        for item in content:
            if isinstance(item, int):
                parts.append({"type": "image", "content": images[item]})
                hf_parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "content": item})
                hf_parts.append({"type": "text", "text": item})
        messages.append(Message(role, parts))
        dicts.append({"role": role, "content": hf_parts})
    return mask_messages(messages), dicts


def _reference_sample(dicts, images_in_order, *, add_generation_prompt=False, processor=None, **template_kwargs):
    processor = processor or _reference()
    text = processor.apply_chat_template(
        dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    return processor(text=[text], images=images_in_order or None, return_tensors="pt")


def _images_in_order(conversation, images):
    return [
        images[i] for _, content in conversation if not isinstance(content, str) for i in content if isinstance(i, int)
    ]


def _expected_runs(messages) -> list[str]:
    """The text of every assistant turn (split where it holds an image) then ``<|im_end|>``: what is trained."""
    runs = []
    for message in messages:
        if message.role != "assistant":
            continue
        current = ""
        for part in message.content:
            if part["type"] == "image":
                if current:
                    runs.append(current)
                current = ""
            else:
                current += part["content"]
        runs.append(current + "<|im_end|>")
    return runs


def _check_encoder_input(encoder_input, expected):
    if "pixel_values" not in expected:
        assert encoder_input["pixel_values"].shape == (0, 1176)
        assert encoder_input["image_grid_thw"].shape == (0, 3)
        assert encoder_input["image_grid_thw"].dtype == torch.int64
        return
    assert encoder_input["image_grid_thw"].dtype == torch.int64
    assert encoder_input["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert encoder_input["pixel_values"].shape == expected["pixel_values"].shape
    assert (encoder_input["pixel_values"] - expected["pixel_values"]).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_sample_matches_transformers_processor(index):
    conversation, images = CONVERSATIONS[index], _images()
    messages, dicts = _build(conversation, images)
    expected = _reference_sample(dicts, _images_in_order(conversation, images))
    ours = _ours()
    out = ours({"messages": messages, "id": index})
    assert out["tokens"] == expected["input_ids"][0].tolist()
    assert len(out["mask"]) == len(out["tokens"]) and out["id"] == index and "messages" not in out
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(out["tokens"], out["mask"])]
    assert runs == _expected_runs(messages)
    _check_encoder_input(out["encoder_input"], expected)
    # the tokenizer's view of the same conversation: the same tokens and mask, without processing pixels
    assert ours.tokenize_messages(messages) == (out["tokens"], out["mask"])


@pytest.mark.parametrize("index", [0, 2, 9, 10, 17])
def test_generation_prompt_matches_transformers_processor(index):
    # the conversation without its last answer, left open for generation: a generation prompt follows
    conversation, images = CONVERSATIONS[index][:-1], _images()
    messages, dicts = _build(conversation, images)
    expected = _reference_sample(dicts, _images_in_order(conversation, images), add_generation_prompt=True)
    out = _ours()({"messages": messages}, inference=True)
    assert out["tokens"] == expected["input_ids"][0].tolist()
    assert _ours().decode(out["tokens"], skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    _check_encoder_input(out["encoder_input"], expected)


@pytest.mark.parametrize("index", [2, 7, 10, 14])
def test_add_vision_id_matches_the_template_option(index):
    conversation, images = CONVERSATIONS[index], _images()
    messages, dicts = _build(conversation, images)
    expected = _reference_sample(dicts, _images_in_order(conversation, images), add_vision_id=True)
    out = _ours(add_vision_id=True)({"messages": messages})
    assert out["tokens"] == expected["input_ids"][0].tolist()
    assert "Picture 1: " in _ours().decode(out["tokens"], skip_special_tokens=False)


def test_release_pixel_budget_by_default():
    images = [_noise(300, 200, seed=1), _noise(481, 640, seed=2)]
    messages, dicts = _build([("user", [0, "and", 1]), ("assistant", "ok")], images)
    reference = _reference(56 * 56, 28 * 28 * 16384)
    expected = _reference_sample(dicts, images, processor=reference)
    out = qwen2_5_vl_transform(_tokenizer_file())({"messages": messages})
    assert out["tokens"] == expected["input_ids"][0].tolist()
    _check_encoder_input(out["encoder_input"], expected)


def test_tokenizer_interface():
    ours = _ours()
    end_of_text, im_end = ours.special_tokens["<|endoftext|>"], ours.special_tokens["<|im_end|>"]
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.stop_tokens) == (
        None,
        end_of_text,
        end_of_text,
        [im_end, end_of_text],
    )
    assert ours.truncation_keeps_mask is False
    assert ours.vocab_size == len(_reference().tokenizer)  # added tokens included
    text = "Hello world, café 42!"
    assert ours.encode(text, add_eos=False) == _reference().tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ours.encode(text)) == text
    conversations = [_build(c, _images())[0] for c in CONVERSATIONS[:3]]
    assert ours.tokenize_messages_batch(conversations) == [ours.tokenize_messages(m) for m in conversations]


def test_text_only_sample_has_empty_encoder_input():
    out = _ours()({"messages": mask_messages([Message("user", "hi"), Message("assistant", "hello")])})
    assert out["encoder_input"]["pixel_values"].shape == (0, 1176)
    assert out["encoder_input"]["pixel_values"].dtype == torch.float32
    assert out["encoder_input"]["image_grid_thw"].shape == (0, 3)
    assert out["encoder_input"]["image_grid_thw"].dtype == torch.int64


def test_prompt_template_is_applied_before_the_chat_template():
    templated = qwen2_5_vl_transform(
        _tokenizer_file(), prompt_template={"user": ("Question: ", "\n")}, max_pixels=MAX_PIXELS
    )
    image = _noise(30, 40)
    messages = [Message("user", [{"type": "image", "content": image}, {"type": "text", "content": "what?"}])]
    by_hand = [Message("user", [{"type": "text", "content": "Question: "}, {"type": "image", "content": image},
                                {"type": "text", "content": "what?\n"}])]  # fmt: skip
    assert templated.tokenize_messages(messages) == _ours().tokenize_messages(by_hand)


# ---- truncation ---------------------------------------------------------------------------------------------------


def _image_spans(tokens, ours):
    """``(start, end)`` of each image's tokens, ``<|vision_start|>`` to ``<|vision_end|>`` inclusive, checking that
    every image is whole."""
    start_id, pad_id, end_id = (
        ours.tokenizer.tokenizer.token_id(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
    )
    spans, position = [], 0
    while pad_id in tokens[position:]:
        first = tokens.index(pad_id, position)
        last = first
        while last + 1 < len(tokens) and tokens[last + 1] == pad_id:
            last += 1
        assert tokens[first - 1] == start_id and last + 1 < len(tokens) and tokens[last + 1] == end_id
        spans.append((first - 1, last + 1))
        position = last + 1
    assert tokens.count(start_id) == len(spans) and tokens.count(end_id) == len(spans)
    return spans


@pytest.mark.parametrize("inference", [False, True])
def test_truncation_never_cuts_an_image(inference):
    # every max_seq_len from 1 to past the end, on a conversation with images in two turns
    conversation, images = CONVERSATIONS[10], _images()
    if inference:
        conversation = conversation[:-1]
    messages, _ = _build(conversation, images)
    full = _ours()({"messages": messages}, inference=inference)
    full_spans = _image_spans(full["tokens"], _ours())
    full_grids = full["encoder_input"]["image_grid_thw"]
    rows = [0, *np.cumsum(full_grids.prod(-1).tolist()).tolist()]
    ours = qwen2_5_vl_transform(_tokenizer_file(), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    eos = ours.eos_id
    for max_seq_len in range(1, len(full["tokens"]) + 3):
        ours.max_seq_len = max_seq_len
        out = ours({"messages": messages}, inference=inference)
        tokens, mask = out["tokens"], out["mask"]
        assert len(tokens) == len(mask) <= max_seq_len
        spans = _image_spans(tokens, ours)
        kept = len(spans)
        assert spans == full_spans[:kept]
        # the images kept are the first ones, with exactly their pixel rows
        assert out["encoder_input"]["image_grid_thw"].tolist() == full_grids[:kept].tolist()
        assert torch.equal(out["encoder_input"]["pixel_values"], full["encoder_input"]["pixel_values"][: rows[kept]])
        if max_seq_len >= len(full["tokens"]):
            assert (tokens, mask) == (full["tokens"], full["mask"])
            continue
        cut_image = next((s for s in full_spans[kept:] if s[0] < max_seq_len), None)
        if inference:  # no EOS: the prefix, ending before the image that did not fit
            assert tokens == full["tokens"][: len(tokens)]
            assert len(tokens) == (cut_image[0] if cut_image else max_seq_len)
        else:  # the prefix, then EOS (masked) in place of the last token: the cut image's <|vision_start|>
            assert tokens[:-1] == full["tokens"][: len(tokens) - 1] and tokens[-1] == eos and mask[-1]
            assert mask[:-1] == full["mask"][: len(tokens) - 1]
            assert len(tokens) == (min(max_seq_len, cut_image[0] + 1) if cut_image else max_seq_len)
        # whatever fits before the cut image is kept: text is cut as text tokenizers cut it
        if cut_image is None:
            assert len(tokens) == max_seq_len


def test_truncation_examples(caplog):
    images = _images()
    messages, _ = _build([("user", ["Look", 0, "and", 1]), ("assistant", "A fox and a dog.")], images)
    ours = qwen2_5_vl_transform(_tokenizer_file(), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    full = ours({"messages": messages})
    (first_start, first_end), (second_start, second_end) = _image_spans(full["tokens"], ours)
    # the second image ends exactly on the last slot: EOS would take its <|vision_end|>, so it goes
    ours.max_seq_len = second_end + 1
    with caplog.at_level(logging.WARNING):
        out = ours({"messages": messages})
    assert f"max_seq_len={second_end + 1} before its image 2" in caplog.text and "max_pixels / 784" in caplog.text
    caplog.clear()
    assert len(out["tokens"]) == second_start + 1 and out["encoder_input"]["image_grid_thw"].shape == (1, 3)
    # one more slot and it stays whole, EOS after it
    ours.max_seq_len = second_end + 2
    out = ours({"messages": messages})
    assert len(out["tokens"]) == second_end + 2 and out["encoder_input"]["image_grid_thw"].shape == (2, 3)
    assert out["tokens"][-1] == ours.eos_id
    # cut inside the first image: no image left, no pixel rows; the drop was logged once, the first time
    ours.max_seq_len = (first_start + first_end) // 2
    with caplog.at_level(logging.WARNING):
        out = ours({"messages": messages})
    assert "Logged once" not in caplog.text
    assert out["tokens"] == full["tokens"][:first_start] + [ours.eos_id]
    assert out["encoder_input"]["pixel_values"].shape == (0, 1176)
    assert out["encoder_input"]["image_grid_thw"].shape == (0, 3)


# ---- errors -------------------------------------------------------------------------------------------------------


def test_errors_name_the_message_and_the_fix():
    ours = _ours()
    with pytest.raises(TypeError, match=r"part 1 of message 0 \(user\) is an image part holding a str; it must hold"):
        ours({"messages": [Message("user", [{"type": "text", "content": "a"}, {"type": "image", "content": "a.png"}])]})
    with pytest.raises(TypeError, match="holding a ndarray"):
        ours.tokenize_messages([Message("user", [{"type": "image", "content": np.zeros((28, 28, 3), np.uint8)}])])
    with pytest.raises(ValueError, match=r"message 0 \(user\) holds a 'video' part; only 'text' and 'image'"):
        ours.tokenize_messages([Message("user", [{"type": "video", "content": "clip.mp4"}])])
    with pytest.raises(ValueError, match="aspect ratio of 300.0"):
        ours({"messages": [Message("user", [{"type": "image", "content": Image.new("RGB", (600, 2))}])]})
    with pytest.raises(ValueError, match=r"message 1 \(user\) contains the text '<\|image_pad\|>'"):
        ours.tokenize_messages([Message("system", "s"), Message("user", "a <|image_pad|> b")])
    with pytest.raises(ValueError, match="max_seq_len must be a positive integer"):
        Qwen2_5_VLTransform(ours.tokenizer, ours.image_transform, max_seq_len=0)
    with pytest.raises(ValueError, match="prompt_template must be a callable"):
        qwen2_5_vl_transform(_tokenizer_file(), prompt_template=42)
    with pytest.raises(ValueError, match="names a chat format; qwen2_5_vl_transform always renders"):
        qwen2_5_vl_transform(_tokenizer_file(), prompt_template="tune.data.Qwen2_5ChatFormat")
