"""Gemma 3's image and model transforms (tune.models.gemma3_vision) against transformers: pixels against the PIL
``Gemma3ImageProcessor`` for images of many sizes and modes, token ids and pixels against ``Gemma3Processor``
(that image processor and an HF tokenizer of the same tiny SentencePiece model, with Gemma 3's chat template) for
conversations with a system prompt, several images, several turns or no image; the loss mask; truncation."""

import functools
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tune.data._tiny_tokenizers import corpus
from tests.tune.models._chat_templates import GEMMA3_TEMPLATE
from tune.data import Message
from tune.models.gemma3 import gemma3_tokenizer
from tune.models.gemma3_vision import Gemma3ImageTransform, Gemma3VisionTransform, gemma3_vision_transform

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402

TOKENS_PER_IMAGE = 4
SMALL = 32  # image side in the conversation tests (the pixel test uses the releases' 896)


@functools.cache
def _tokenizer_dir() -> Path:
    """A tiny Gemma-style SentencePiece model that also holds Gemma 3's image markers (as the releases' does)."""
    import sentencepiece as spm

    out = Path(tempfile.mkdtemp(prefix="tune-gemma3-vision-"))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=str(out / "tokenizer"), vocab_size=480, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, character_coverage=1.0,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"],
        minloglevel=2, num_threads=1, pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>", eos_piece="<eos>",
        pad_piece="<pad>",
    )  # fmt: skip
    return out


def _image_processor(size: int) -> Gemma3ImageProcessorPil:
    # google/gemma-3-4b-it's preprocessor_config.json: bilinear (2), 1/255, mean = std = 0.5, no pan-and-scan
    return Gemma3ImageProcessorPil(
        size={"height": size, "width": size}, resample=2, rescale_factor=1 / 255, image_mean=[0.5] * 3,
        image_std=[0.5] * 3, do_pan_and_scan=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def processor():
    hf_tokenizer = transformers.GemmaTokenizer.from_pretrained(
        str(_tokenizer_dir()),
        chat_template=GEMMA3_TEMPLATE,
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )  # fmt: skip
    return transformers.Gemma3Processor(
        image_processor=_image_processor(SMALL), tokenizer=hf_tokenizer, chat_template=GEMMA3_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def transform(processor):
    return gemma3_vision_transform(
        str(_tokenizer_dir() / "tokenizer.model"), image_size=SMALL, tokens_per_image=TOKENS_PER_IMAGE,
        image_token_id=processor.tokenizer.image_token_id,
    )  # fmt: skip


def _images(count: int, seed: int) -> list:
    """Random images of varied sizes (wide, tall, tiny, larger than the output) and modes (alpha, grey, palette)."""
    rng = np.random.RandomState(seed)
    modes = ["RGB", "RGBA", "L", "P", "LA", "RGB", "RGB"]
    images = []
    for i in range(count):
        height, width = int(rng.randint(1, 1200)), int(rng.randint(1, 1200))
        if i % 5 == 0:
            height, width = int(rng.randint(1, 40)), int(rng.randint(200, 900))  # very wide
        image = Image.fromarray(rng.randint(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
        mode = modes[i % len(modes)]
        images.append(image if mode == "RGBA" else image.convert(mode))
    return images


def test_pixels_match_gemma3_image_processor():
    ours = Gemma3ImageTransform(896)
    reference = _image_processor(896)
    images = _images(24, seed=0)
    errors = []
    for image in images:
        expected = torch.as_tensor(np.asarray(reference(image)["pixel_values"][0]))
        actual = ours(image)
        assert actual.shape == (3, 896, 896) and actual.dtype == torch.float32
        errors.append((actual - expected).abs().max().item())
    print(f"gemma3 image transform, {len(images)} images: max abs pixel error {max(errors):.3e}")
    assert max(errors) <= 1e-5


def _conversations(seed: int = 0) -> list[list[tuple[str, list]]]:
    """Seeded conversations as (role, parts) with parts ("text", str) or ("image", PIL image): text only, images
    anywhere in a user turn (first, between texts, last, two in a row), a system prompt or not, 1-3 exchanges."""
    rng = random.Random(seed)
    words = "the quick brown fox what is this picture describe café 42 colour 3.14 why how".split()
    pool = _images(40, seed=1)

    def text() -> str:
        body = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        return rng.choice(["", " ", "\n"]) + body + rng.choice(["", "?", " ", ".\n"])

    conversations = []
    for i in range(24):
        messages = [("system", [("text", text())])] if i % 3 == 0 else []
        for turn in range(rng.randint(1, 3)):
            parts = [("text", text())]
            num_images = 0 if i % 6 == 5 else rng.randint(0 if turn else 1, 3)
            for _ in range(num_images):
                parts.insert(rng.randint(0, len(parts)), ("image", rng.choice(pool)))
            messages += [("user", parts), ("assistant", [("text", text())])]
        conversations.append(messages)
    return conversations


def _tune_messages(conversation) -> list[Message]:
    return [
        Message(role, [{"type": kind, "content": value} for kind, value in parts], masked=role != "assistant")
        for role, parts in conversation
    ]


def _hf_messages(conversation) -> list[dict]:
    def part(kind, value):
        return {"type": "image", "image": value} if kind == "image" else {"type": "text", "text": value}

    messages = []
    for role, parts in conversation:
        if role == "system":  # the template takes a system prompt's text as it is
            messages.append({"role": role, "content": parts[0][1]})
        else:
            messages.append({"role": role, "content": [part(kind, value) for kind, value in parts]})
    return messages


def test_tokens_and_pixels_match_gemma3_processor(processor, transform):
    conversations = _conversations()
    with_images = sum(any(kind == "image" for _, parts in c for kind, _ in parts) for c in conversations)
    assert len(conversations) >= 20 and 3 <= with_images < len(conversations)
    for conversation in conversations:
        expected = processor.apply_chat_template(
            _hf_messages(conversation), tokenize=True, return_dict=True, return_tensors="pt"
        )
        sample = transform({"messages": _tune_messages(conversation), "id": 7})
        assert sample["tokens"] == expected["input_ids"][0].tolist()
        assert sample["id"] == 7 and len(sample["mask"]) == len(sample["tokens"])
        images = sample["encoder_input"]["images"]
        if "pixel_values" in expected:
            assert images.shape == expected["pixel_values"].shape
            assert (images - expected["pixel_values"]).abs().max().item() <= 1e-5
        else:
            assert images.shape == (0, 3, SMALL, SMALL)
    print(f"gemma3 model transform: {len(conversations)} conversations ({with_images} with images) match")


def test_mask_trains_exactly_the_assistant_turns(transform):
    end_of_turn = transform.special_tokens["<end_of_turn>"]
    for conversation in _conversations(seed=3):
        tokens, mask = transform.tokenize_messages(_tune_messages(conversation))
        runs, current = [], []
        for token, masked in zip(tokens, mask):
            if not masked:
                current.append(token)
            elif current:
                runs, current = [*runs, current], []
        runs += [current] if current else []
        answers = [parts[0][1].strip() for role, parts in conversation if role == "assistant"]
        assert len(runs) == len(answers)
        for run, answer in zip(runs, answers):
            assert run[-1] == end_of_turn and transform.image_token_id not in run
            assert transform.decode(run[:-1]) == answer


def _image_conversation():
    image = _images(1, seed=2)[0]
    return [
        Message("user", [{"type": "text", "content": "what is this"}, {"type": "image", "content": image},
                         {"type": "text", "content": "and this"}, {"type": "image", "content": image}]),
        Message("assistant", "the quick brown fox"),
    ]  # fmt: skip


def test_truncation_never_cuts_through_an_image(transform):
    messages = _image_conversation()
    full, full_mask, images = transform.tokenize_with_images(messages)
    assert len(images) == 2
    boi = transform.special_tokens["<start_of_image>"]
    eoi = transform.special_tokens["<end_of_image>"]
    starts = [i for i, t in enumerate(full) if t == boi]
    ends = [i for i, t in enumerate(full) if t == eoi]
    path = str(_tokenizer_dir() / "tokenizer.model")
    for max_seq_len in range(starts[0] - 1, len(full) + 2):
        cut = gemma3_vision_transform(
            path, max_seq_len=max_seq_len, image_size=SMALL, tokens_per_image=TOKENS_PER_IMAGE,
            image_token_id=transform.image_token_id,
        )  # fmt: skip
        sample = cut({"messages": messages})
        tokens, mask = sample["tokens"], sample["mask"]
        kept = sample["encoder_input"]["images"].shape[0]
        if max_seq_len >= len(full):
            assert tokens == full and mask == full_mask and kept == 2
            continue
        assert len(tokens) <= max_seq_len and tokens[-1] == transform.eos_id and mask[-1]
        assert tokens[:-1] == full[: len(tokens) - 1]
        # every image whose tokens are in is whole (up to its <end_of_image>), and its pixels are kept
        assert tokens.count(transform.image_token_id) == kept * TOKENS_PER_IMAGE
        assert kept == sum(end < len(tokens) - 1 for end in ends)
        assert boi not in tokens[len(tokens) - 1 :] and tokens.count(boi) == kept
        if kept < 2:  # cut just before the dropped image's <start_of_image>, or earlier when the cut was earlier
            assert len(tokens) == min(max_seq_len, starts[kept])


def test_generation_prompt_and_text_tokenizer_interface(transform):
    text_only = [Message("user", "describe the fox"), Message("assistant", "a quick brown fox")]
    reference = gemma3_tokenizer(str(_tokenizer_dir() / "tokenizer.model"))
    assert transform.tokenize_messages(text_only) == reference.tokenize_messages(text_only)
    prompt = transform({"messages": _image_conversation()[:1]}, inference=True)
    assert prompt["tokens"][-3:] == reference.encode("<start_of_turn>model\n", add_bos=False, add_eos=False)[-3:]
    assert (transform.bos_id, transform.eos_id, transform.pad_id) == (2, 1, 0)
    assert transform.stop_tokens == reference.stop_tokens and transform.max_seq_len is None
    assert transform.encode("the fox") == reference.encode("the fox")
    # decoding leaves the image tokens (outside the SentencePiece vocabulary) out
    text_ids = [t for t in prompt["tokens"] if t != transform.image_token_id]
    assert transform.decode(prompt["tokens"], skip_special_tokens=False) == reference.decode(
        text_ids, skip_special_tokens=False
    )


def test_mistakes_are_named(transform):
    with pytest.raises(TypeError, match="PIL images"):
        Gemma3ImageTransform(SMALL)(torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="image part"):
        transform.tokenize_messages([Message("user", "look <start_of_image> here"), Message("assistant", "ok")])
    with pytest.raises(ValueError, match="<start_of_image>"):
        Gemma3VisionTransform(gemma3_tokenizer(_gemma_without_image_markers()), Gemma3ImageTransform(SMALL))


def _gemma_without_image_markers() -> str:
    from tests.tune.data._tiny_tokenizers import gemma_sentencepiece_model

    return str(gemma_sentencepiece_model() / "tokenizer.model")
