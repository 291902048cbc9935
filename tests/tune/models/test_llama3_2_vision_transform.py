"""Llama 3.2 Vision's model transform (tune.models.llama3_2_vision.Llama3VisionTransform) against its references,
on conversations with images built from the tiny tiktoken file of tests/tune/data/_tiny_tokenizers.py:

- tokens and loss masks: torchtune 0.6.1's ``llama3_tokenizer`` (what its ``Llama3VisionTransform`` tokenises
  with; the transform module itself imports torchvision, not installed), given the same special tokens, which puts
  ``<|image|>`` for each image part. torchtune gives an image token its message's mask; tune never trains image
  tokens, so in trained turns (``train_on_input``) the expected mask is torchtune's with image tokens masked;
- cross-attention masks: torchtune 0.6.1's ``VisionCrossAttentionMask`` on torchtune's tokens, with each image's
  number of tiles from transformers' ``MllamaImageProcessorPil``;
- tiles and aspect ratios: ``MllamaImageProcessorPil`` (Llama 3.2 Vision's settings, a tiny tile).

torchtune runs in a subprocess from the site of tests/recipes/test_torchtune_first_losses.py.
"""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from tests.recipes.test_torchtune_first_losses import torchtune_site  # noqa: F401  (the session fixture)
from tests.tune.data._tiny_tokenizers import tiktoken_file
from tune.data import Message
from tune.models.llama3 import llama3_special_tokens, llama3_tokenizer
from tune.models.llama3_2_vision import Llama3VisionTransform, llama3_2_vision_transform

mllama = pytest.importorskip("transformers.models.mllama.image_processing_pil_mllama")

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
TILE, PATCH = 28, 14
_WORDS = "the quick brown fox what is in this picture a cat dog two café 42 naïve why? yes, no. see here".split()


def _text(rng: random.Random) -> str:
    body = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8)))
    return rng.choice(["", " ", "\n", "  "]) + body + rng.choice(["", " ", "\n", ".\n"])


def _conversation(rng: random.Random, train_on_input: bool) -> list[dict]:
    """Messages as ``{"role", "masked", "parts": [["text", str] | ["image", [width, height, seed]]]}``: a system
    prompt sometimes, 1-3 exchanges, user turns with 0-3 images at the start, between texts, in a row or last."""
    messages = [{"role": "system", "masked": True, "parts": [["text", _text(rng)]]}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        parts = [["text", _text(rng)]]
        for _ in range(rng.randint(0, 3)):
            size = [rng.choice([1, 9, 27, 28, 40, 75, 120, 300]), rng.choice([1, 13, 28, 33, 56, 90, 200])]
            parts.insert(rng.randint(0, len(parts)), ["image", [*size, rng.randrange(1000)]])
        if rng.random() < 0.15:
            parts = [part for part in parts if part[0] == "image"] or parts  # an image-only turn
        messages.append({"role": "user", "masked": not train_on_input, "parts": parts})
        messages.append({"role": "assistant", "masked": False, "parts": [["text", _text(rng)]]})
    return messages


def _conversations() -> list[list[dict]]:
    rng = random.Random(0)
    conversations = [_conversation(rng, train_on_input=i % 4 == 3) for i in range(24)]
    # the layouts of the brief spelled out: images first, between turns, consecutive, text after the last image
    image = lambda seed: ["image", [50, 20, seed]]  # noqa: E731
    conversations += [
        [{"role": "user", "masked": True, "parts": [image(1), image(2), ["text", "Compare them."]]},
         {"role": "assistant", "masked": False, "parts": [["text", "The first is wider."]]}],
        [{"role": "user", "masked": True, "parts": [["text", "Look:"], image(3)]},
         {"role": "assistant", "masked": False, "parts": [["text", "A box."]]},
         {"role": "user", "masked": True, "parts": [image(4), ["text", "And this one?"], image(5)]},
         {"role": "assistant", "masked": False, "parts": [["text", "Two more boxes."]]}],
    ]  # fmt: skip
    return conversations


def _image(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _messages(conversation: list[dict]) -> list[Message]:
    def part(kind, value):
        return {"type": "text", "content": value} if kind == "text" else {"type": "image", "content": _image(*value)}

    return [Message(m["role"], [part(*p) for p in m["parts"]], masked=m["masked"]) for m in conversation]


def _hf_num_tiles(conversation: list[dict]) -> list[int]:
    processor = mllama.MllamaImageProcessorPil(size={"height": TILE, "width": TILE}, max_image_tiles=4)
    sizes = [value for m in conversation for kind, value in m["parts"] if kind == "image"]
    return [int(processor(_image(*size), return_tensors="np")["num_tiles"][0][0]) for size in sizes]


_TORCHTUNE_SCRIPT = """
import importlib, json, sys
try:
    importlib.import_module("torchao.dtypes.nf4tensor")
except ImportError:  # torchtune 0.6.1 imports a torchao module that later releases moved
    sys.modules["torchao.dtypes.nf4tensor"] = importlib.import_module(
        "torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
import torch
from PIL import Image
from torchtune.data import Message
from torchtune.models.llama3 import llama3_tokenizer
from torchtune.modules.transforms import VisionCrossAttentionMask

data = json.load(sys.stdin)
tokenizer = llama3_tokenizer(data["path"], special_tokens_path=data["special_tokens_path"],
                             max_seq_len=data["max_seq_len"])
xattn = VisionCrossAttentionMask(tile_size=data["tile"], patch_size=data["patch"], image_token_id=tokenizer.image_id)
out = {"ids": {"image": tokenizer.image_id, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id,
               "stop": tokenizer.stop_tokens},
       "encoded": tokenizer.encode(data["text"], add_bos=True, add_eos=True), "samples": []}
for conversation, num_tiles, inference in zip(data["conversations"], data["num_tiles"], data["inference"]):
    def part(kind, value):
        return {"type": kind, "content": value if kind == "text" else Image.new("RGB", tuple(value[:2]))}
    messages = [Message(m["role"], [part(*p) for p in m["parts"]], masked=m["masked"]) for m in conversation]
    sample = tokenizer({"messages": messages}, inference=inference)
    result = {"tokens": sample["tokens"], "mask": sample["mask"]}
    if sample["tokens"].count(tokenizer.image_id) == len(num_tiles):
        sample["encoder_input"] = {"images": [torch.empty(n, 3, 1, 1) for n in num_tiles]}
        result["encoder_mask"] = [m.int().tolist() for m in xattn(sample)["encoder_mask"]]
    out["samples"].append(result)
json.dump(out, sys.stdout)
"""


def _special_tokens_json(directory) -> str:
    """A tokenizer.json holding only ``added_tokens``: Llama 3's special tokens as torchtune 0.6.1 names them, with
    ``<|image|>`` after the 256 of them, numbered after the tiny file's ranks (tests/recipes/test_torchtune_tokens.py
    does the same for the text families)."""
    num_ranks = len(tiktoken_file().read_text().splitlines())
    special = llama3_special_tokens(num_ranks)
    special["<|step_id|>"] = special.pop("<|reserved_special_token_2|>")
    special["<|video|>"] = special.pop("<|reserved_special_token_4|>")
    special["<|image|>"] = num_ranks + 256
    path = directory / "llama3_vision_special_tokens.json"
    path.write_text(json.dumps({"added_tokens": [{"id": i, "content": c} for c, i in special.items()]}))
    return str(path)


CONVERSATIONS = _conversations()
INFERENCE = [i % 5 == 4 for i in range(len(CONVERSATIONS))]  # some left open for generation
TEXT = "Hello world, café 12345 naïve!\n\n  spaces\tand tabs"


def _torchtune(site, special_tokens_path: str, conversations, inference, max_seq_len=None) -> dict:
    payload = {
        "path": str(tiktoken_file()), "special_tokens_path": special_tokens_path, "max_seq_len": max_seq_len,
        "tile": TILE, "patch": PATCH, "text": TEXT, "conversations": conversations, "inference": inference,
        "num_tiles": [_hf_num_tiles(c) for c in conversations],
    }  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", _TORCHTUNE_SCRIPT], input=json.dumps(payload), capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(site)}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def special_tokens_path(tmp_path_factory) -> str:
    return _special_tokens_json(tmp_path_factory.mktemp("llama3_vision"))


@pytest.fixture(scope="module")
def reference(torchtune_site, special_tokens_path):  # noqa: F811
    return _torchtune(torchtune_site, special_tokens_path, CONVERSATIONS, INFERENCE)


def _transform(**kwargs) -> Llama3VisionTransform:
    return Llama3VisionTransform(
        str(tiktoken_file()), tile_size=TILE, patch_size=PATCH, max_num_tiles=4, image_mean=MEAN, image_std=STD,
        **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("special", ["built-in", "special_tokens_path"])
def test_tokens_masks_and_cross_attention_equal_torchtune(reference, special_tokens_path, special, capsys):
    transform = _transform(special_tokens_path=special_tokens_path if special != "built-in" else None)
    assert transform.image_id == reference["ids"]["image"]
    images = 0
    for conversation, inference, expected in zip(CONVERSATIONS, INFERENCE, reference["samples"]):
        out = transform({"messages": _messages(conversation), "id": 7}, inference=inference)
        assert out["tokens"] == expected["tokens"]
        # image tokens are never trained (torchtune gives them their message's mask)
        expected_mask = [m or t == transform.image_id for t, m in zip(expected["tokens"], expected["mask"])]
        assert out["mask"] == expected_mask
        assert [m.int().tolist() for m in out["encoder_mask"]] == expected["encoder_mask"]
        assert out["id"] == 7 and "messages" not in out
        images += len(out["encoder_input"]["images"])
    with capsys.disabled():
        print(
            f"\n{len(CONVERSATIONS)} conversations with {images} images: tokens, masks, cross-attention = torchtune's"
        )
    assert images >= 30


def test_images_equal_hf_mllama_processor():
    transform = _transform()
    processor = mllama.MllamaImageProcessorPil(
        size={"height": TILE, "width": TILE}, max_image_tiles=4, image_mean=list(MEAN), image_std=list(STD)
    )
    ratios = mllama.get_all_supported_aspect_ratios(4)
    for conversation in CONVERSATIONS[:8]:
        messages = _messages(conversation)
        out = transform({"messages": messages})
        images = [part["content"] for m in messages for part in m.content if part["type"] == "image"]
        assert len(out["encoder_input"]["images"]) == len(images)
        for image, tiles, ratio in zip(images, out["encoder_input"]["images"], out["encoder_input"]["aspect_ratio"]):
            expected = processor(image, return_tensors="np")
            num_tiles = expected["num_tiles"][0][0]
            assert tiles.dtype == torch.float32
            assert np.abs(tiles.numpy() - expected["pixel_values"][0, 0, :num_tiles]).max() <= 1e-6
            assert tuple(ratio.tolist()) == ratios[expected["aspect_ratio_ids"][0, 0] - 1]


def test_tokenizer_interface_equals_torchtune(reference):
    transform = _transform(max_seq_len=64)
    ids = reference["ids"]
    assert (transform.bos_id, transform.eos_id, transform.pad_id) == (ids["bos"], ids["eos"], ids["pad"])
    assert sorted(transform.stop_tokens) == sorted(ids["stop"])
    assert transform.max_seq_len == 64 and transform.vocab_size == ids["image"] + 1
    assert transform.encode(TEXT) == reference["encoded"]
    conversation = _messages(CONVERSATIONS[0])
    tokens, mask = transform.tokenize_messages(conversation)
    out = transform({"messages": conversation})
    assert (tokens, mask) == (out["tokens"], out["mask"])
    # the text families' Llama 3 tokenizer is unchanged: same ids for text, no <|image|>
    text = llama3_tokenizer(str(tiktoken_file()))
    assert "<|image|>" not in text.special_tokens and text.encode(TEXT) == transform.encode(TEXT)
    eos = transform.eos_id
    assert transform.decode([*transform.encode("a cat", add_bos=False), eos, 300]) == "a cat"
    assert transform.decode([*transform.encode("a", add_bos=False), eos], truncate_at_eos=False) == "a"


def test_truncation_drops_the_images_it_cuts(torchtune_site, special_tokens_path):  # noqa: F811
    conversation = CONVERSATIONS[-1]  # images in both user turns
    transform = _transform(max_seq_len=30)
    expected = _torchtune(torchtune_site, special_tokens_path, [conversation], [False], max_seq_len=30)["samples"][0]
    out = transform({"messages": _messages(conversation)})
    assert out["tokens"] == expected["tokens"] and len(out["tokens"]) == 30
    kept = out["tokens"].count(transform.image_id)
    assert 0 < kept < 3  # torchtune raises here: its images outnumber the tokens left
    assert len(out["encoder_input"]["images"]) == len(out["encoder_mask"]) == kept
    assert all(m.shape[0] == 30 for m in out["encoder_mask"])


def test_builder_uses_llama3_2_vision_settings():
    transform = llama3_2_vision_transform(str(tiktoken_file()))
    assert transform.max_seq_len == 8192 and transform.max_num_tiles == 4
    assert transform.transform_image.tile_size == 560 and transform.xattn_mask.patches_per_tile == 1600
    assert transform.image_seq_len == 4 * 1601
    assert transform.transform_image.mean == list(MEAN) and transform.transform_image.std == list(STD)
    out = transform({"messages": [Message("user", [{"type": "image", "content": _image(700, 300, 0)}]),
                                  Message("assistant", "wide")]})  # fmt: skip
    assert out["encoder_input"]["images"][0].shape == (2, 3, 560, 560)
    assert out["encoder_mask"][0].shape == (len(out["tokens"]), 2 * 1601)
    assert llama3_2_vision_transform(str(tiktoken_file()), image_size=448).transform_image.tile_size == 448


@pytest.mark.parametrize("image_size", [0, 500, -14, "560", True, 560.0])
def test_builder_rejects_bad_image_size(image_size):
    with pytest.raises(ValueError, match="image_size must be a positive multiple of the patch size 14"):
        llama3_2_vision_transform(str(tiktoken_file()), image_size=image_size)


def test_errors(tmp_path):
    transform = _transform()
    bad = [Message("user", [{"type": "image", "content": _image(5, 5, 0)}, {"type": "text", "content": "and"},
                            {"type": "image", "content": np.zeros((4, 4, 3), dtype=np.uint8)}]),
           Message("assistant", "ok")]  # fmt: skip
    with pytest.raises(TypeError, match="image 1 of the sample: an image must be a PIL.Image.Image"):
        transform({"messages": bad})
    with pytest.raises(ValueError, match="image 0 of the sample: .*channels first"):
        transform({"messages": [Message("user", [{"type": "image", "content": torch.zeros(5, 5, 3)}])]})
    with pytest.raises(ValueError, match="multiple of patch_size"):
        Llama3VisionTransform(str(tiktoken_file()), tile_size=30, patch_size=14)
    no_image = tmp_path / "special.json"
    special = llama3_special_tokens(len(tiktoken_file().read_text().splitlines()))
    no_image.write_text(json.dumps({"added_tokens": [{"id": i, "content": c} for c, i in special.items()]}))
    with pytest.raises(ValueError, match=r"lists no <\|image\|> token"):
        Llama3VisionTransform(str(tiktoken_file()), tile_size=TILE, patch_size=PATCH, special_tokens_path=str(no_image))
