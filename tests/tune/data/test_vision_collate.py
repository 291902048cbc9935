"""The image collates (tune/data/_vision_collate.py): ``padded_collate_tiled_images_and_mask`` against torchtune
0.6.1's function of that name, run in a subprocess from the torchtune site-packages the recipe tests install
(``~/.cache/tune-tests/torchtune-0.6.1-site``, see tests/recipes/test_torchtune_first_losses.py), on batches it
accepts, and by hand where tune goes further (rows and batches without images); ``padded_collate_images`` by
hand (what it must give follows from ``padded_collate_sft`` and a concatenation)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tune.data import padded_collate_images, padded_collate_sft, padded_collate_tiled_images_and_mask

_SITE = Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests")) / "torchtune-0.6.1-site"
_REFERENCE = """
import sys, torch
from torchtune.data import padded_collate_tiled_images_and_mask
cases = torch.load(sys.argv[1], weights_only=True)
torch.save([padded_collate_tiled_images_and_mask(batch, **kwargs) for batch, kwargs in cases], sys.argv[2])
"""


def _sample(rng: torch.Generator, seq_len: int, tiles: list[int], tokens_per_tile: int = 3, labels: bool = True):
    tokens = torch.randint(1, 50, (seq_len,), generator=rng).tolist()
    sample = {
        "tokens": tokens,
        "encoder_input": {
            "images": [torch.rand(n, 3, 2, 2, generator=rng) for n in tiles],
            "aspect_ratio": [torch.tensor([1, n]) for n in tiles],
        },
        "encoder_mask": [torch.rand(seq_len, n * tokens_per_tile, generator=rng) > 0.5 for n in tiles],
    }
    if labels:
        sample["labels"] = [t if i % 3 else -100 for i, t in enumerate(tokens)]
    return sample


def _cases() -> list[tuple[list[dict], dict]]:
    rng = torch.Generator().manual_seed(0)
    c, h, w = 1, 1, 1
    doc_example = [  # torchtune's docstring example
        {
            "tokens": [1, 2, 1, 3], "labels": [4, 5, 6, 7],
            "encoder_input": {"images": [torch.ones(2, c, h, w), torch.ones(3, c, h, w)],
                              "aspect_ratio": [torch.tensor([1, 2]), torch.tensor([1, 3])]},
            "encoder_mask": [torch.ones(4, 5 * 2), torch.ones(4, 5 * 3)],
        },
        {
            "tokens": [1, 4], "labels": [8, 9],
            "encoder_input": {"images": [torch.ones(4, c, h, w)], "aspect_ratio": [torch.tensor([2, 2])]},
            "encoder_mask": [torch.ones(2, 5 * 4)],
        },
    ]  # fmt: skip
    mixed = [_sample(rng, 7, [2, 1]), _sample(rng, 4, [4]), _sample(rng, 9, [1, 3, 2])]
    single = [_sample(rng, 5, [1])]
    prompts = [_sample(rng, 3, [2], labels=False), _sample(rng, 6, [1, 1], labels=False)]
    return [
        (doc_example, {}),
        (mixed, {}),
        (mixed, {"padding_idx": 7, "ignore_idx": -1}),
        (mixed, {"pad_max_tiles": 4, "pad_max_images": 4}),
        (single, {"pad_max_images": 2}),
        (prompts, {"pad_direction": "left"}),
        (prompts, {"pad_direction": "left", "pad_max_tiles": 3, "pad_max_images": 3}),
    ]


def _assert_same(actual, expected, where: str) -> None:
    if isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            _assert_same(actual[key], expected[key], f"{where}.{key}")
    else:
        assert actual.shape == expected.shape, (where, actual.shape, expected.shape)
        assert actual.dtype == expected.dtype, (where, actual.dtype, expected.dtype)
        assert torch.equal(actual, expected), where


def test_tiled_collate_matches_torchtune(tmp_path):
    if not (_SITE / "torchtune" / "data" / "_collate.py").is_file():
        pytest.skip(f"torchtune 0.6.1 is not installed in {_SITE} (the recipe tests install it there)")
    cases = _cases()
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "PYTHONPATH": str(_SITE)}
    run = subprocess.run(
        [sys.executable, "-c", _REFERENCE, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    expected = torch.load(tmp_path / "out.pt", weights_only=True)
    for i, ((batch, kwargs), reference) in enumerate(zip(cases, expected, strict=True)):
        actual = padded_collate_tiled_images_and_mask(batch, **kwargs)
        reference["encoder_mask"] = _images_side_by_side(reference, kwargs)
        _assert_same(actual, reference, f"case {i} {kwargs}")
    print(f"padded_collate_tiled_images_and_mask: {len(cases)} batches equal torchtune 0.6.1's (masks side by side)")


def _images_side_by_side(reference: dict, kwargs: dict) -> torch.Tensor:
    """torchtune's ``encoder_mask`` with each row's image masks side by side along the image tokens.

    torchtune 0.6.1 stacks a row's masks as [b, max_images, s, image_len] and then calls ``.view(b, s, -1)``,
    which, with two images or more, reads the stacked masks in memory order rather than putting mask i in columns
    ``i * image_len ...``: text row r then holds rows of several images' masks. Its docstring asks for the masks
    "concatenated across image_seq_len"; tune does that (and the two agree with one image per row), so the reference
    is taken apart the way torchtune stacked it and put back side by side."""
    mask, images = reference["encoder_mask"], reference["encoder_input"]["images"]
    batch_size, num_images, num_tiles = images.shape[:3]
    seq_len, width = mask.shape[1], mask.shape[2]
    image_len = width // (kwargs.get("pad_max_images") or num_images)
    used = mask[..., : num_images * image_len].reshape(batch_size, num_images, seq_len, image_len)
    side_by_side = used.permute(0, 2, 1, 3).reshape(batch_size, seq_len, num_images * image_len)
    return torch.cat([side_by_side, mask[..., num_images * image_len :]], dim=2)


def test_tiled_collate_layout_by_hand():
    rng = torch.Generator().manual_seed(1)
    batch = [_sample(rng, 4, [2, 1], tokens_per_tile=2), _sample(rng, 2, [3], tokens_per_tile=2)]
    out = padded_collate_tiled_images_and_mask(batch)
    images, ratios, mask = out["encoder_input"]["images"], out["encoder_input"]["aspect_ratio"], out["encoder_mask"]
    assert images.shape == (2, 2, 3, 3, 2, 2) and ratios.tolist() == [[[1, 2], [1, 1]], [[1, 3], [1, 1]]]
    assert torch.equal(images[0, 0, :2], batch[0]["encoder_input"]["images"][0]) and not images[0, 0, 2:].any()
    assert not images[1, 1].any()  # the padding image of row 1
    assert mask.shape == (2, 4, 2 * 3 * 2)  # [b, s, max_images * max_tiles * tokens_per_tile]
    assert torch.equal(mask[0, :, :4], batch[0]["encoder_mask"][0]) and not mask[0, :, 4:6].any()
    assert torch.equal(mask[0, :, 6:8], batch[0]["encoder_mask"][1]) and not mask[0, :, 8:].any()
    assert torch.equal(mask[1, :2, :6], batch[1]["encoder_mask"][0]) and not mask[1, 2:].any()


def test_tiled_collate_takes_rows_and_batches_without_images():
    rng = torch.Generator().manual_seed(2)
    text_only = {"tokens": [5, 6, 7], "labels": [5, 6, 7], "encoder_input": {"images": [], "aspect_ratio": []},
                 "encoder_mask": []}  # fmt: skip
    batch = [_sample(rng, 2, [2]), text_only]
    out = padded_collate_tiled_images_and_mask(batch)
    assert out["encoder_input"]["images"].shape == (2, 1, 2, 3, 2, 2) and not out["encoder_input"]["images"][1].any()
    assert out["encoder_input"]["aspect_ratio"][1].tolist() == [[1, 1]]
    assert out["encoder_mask"].shape == (2, 3, 6) and not out["encoder_mask"][1].any()
    assert torch.equal(out["tokens"], padded_collate_sft(batch)["tokens"])
    none = padded_collate_tiled_images_and_mask([text_only, {"tokens": [1], "labels": [1]}])
    assert none["encoder_input"] is None and none["encoder_mask"] is None
    assert none["labels"].tolist() == [[5, 6, 7], [1, -100, -100]]


def test_tiled_collate_names_mistakes():
    rng = torch.Generator().manual_seed(3)
    batch = [_sample(rng, 3, [3])]
    with pytest.raises(ValueError, match="pad_direction"):
        padded_collate_tiled_images_and_mask(batch, pad_direction="up")
    with pytest.raises(ValueError, match="pad_max_tiles=2"):
        padded_collate_tiled_images_and_mask(batch, pad_max_tiles=2)
    with pytest.raises(ValueError, match="pad_max_images=0"):
        padded_collate_tiled_images_and_mask(batch, pad_max_images=0)
    batch[0]["encoder_mask"] = []
    with pytest.raises(ValueError, match="1 images, 1 aspect ratios and 0 encoder masks"):
        padded_collate_tiled_images_and_mask(batch)


def test_flat_collate_joins_images_row_after_row():
    a, b = torch.rand(2, 3, 4, 4), torch.rand(1, 3, 4, 4)
    batch = [
        {"tokens": [1, 2, 3], "labels": [-100, 2, 3], "encoder_input": {"images": a}},
        {"tokens": [4], "labels": [4], "encoder_input": {"images": torch.zeros(0, 3, 4, 4)}},  # no image
        {"tokens": [5, 6], "labels": [5, 6], "encoder_input": {"images": b}},
    ]
    out = padded_collate_images(batch, padding_idx=9, pad_to_multiple_of=4)
    expected = padded_collate_sft(batch, 9, -100, 4)
    assert torch.equal(out["tokens"], expected["tokens"]) and torch.equal(out["labels"], expected["labels"])
    assert out["tokens"].shape == (3, 4)
    assert torch.equal(out["encoder_input"]["images"], torch.cat([a, b]))
    # Qwen2.5-VL's layout: patches and grids, every key joined the same way; a row may lack encoder_input
    qwen = [
        {"tokens": [1], "labels": [1], "encoder_input": {"pixel_values": torch.rand(8, 1176),
                                                         "image_grid_thw": torch.tensor([[1, 2, 4]])}},
        {"tokens": [2, 3], "labels": [2, 3]},
        {"tokens": [4], "labels": [4], "encoder_input": {"pixel_values": torch.rand(4, 1176),
                                                         "image_grid_thw": torch.tensor([[1, 2, 2]])}},
    ]  # fmt: skip
    out = padded_collate_images(qwen)
    assert out["encoder_input"]["pixel_values"].shape == (12, 1176)
    assert out["encoder_input"]["image_grid_thw"].tolist() == [[1, 2, 4], [1, 2, 2]]


def test_flat_collate_without_images():
    text = [{"tokens": [1, 2], "labels": [1, 2]}, {"tokens": [3], "labels": [3]}]
    assert padded_collate_images(text)["encoder_input"] is None
    empty = [{**sample, "encoder_input": {"images": torch.zeros(0, 3, 4, 4)}} for sample in text]
    assert padded_collate_images(empty)["encoder_input"]["images"].shape == (0, 3, 4, 4)


def test_flat_collate_names_mistakes():
    batch = [
        {"tokens": [1], "labels": [1], "encoder_input": {"images": torch.zeros(1, 3, 2, 2)}},
        {"tokens": [2], "labels": [2], "encoder_input": {"pixel_values": torch.zeros(1, 6)}},
    ]
    with pytest.raises(ValueError, match="same model transform"):
        padded_collate_images(batch)
    with pytest.raises(ValueError, match="padded_collate_tiled_images_and_mask"):
        padded_collate_images([{"tokens": [1], "labels": [1], "encoder_input": {"images": [torch.zeros(1, 3, 2, 2)]}}])
