"""The tiling image transform and its helpers (tune.modules.transforms.vision_utils, tune.models.clip's
CLIPImageTransform) and the vision cross-attention mask, against their references:

- tiles and aspect ratios of ``MllamaImageProcessorPil`` (transformers' PIL Llama 3.2 Vision image processor) for
  images of many sizes and modes: equal to the bit (the steps are the same: Pillow's bilinear resize of the uint8
  image, zero padding, rescale by 1/255 in float64, normalisation in float32); the test allows 1e-6;
- torchtune 0.6.1's ``find_supported_resolutions``, ``get_canvas_best_fit``, ``get_inscribed_size``,
  ``pad_dim_to_size`` and ``VisionCrossAttentionMask`` (run in a subprocess from the torchtune site of
  tests/recipes/test_torchtune_first_losses.py; torchtune's ``resize_with_pad`` needs torchvision, not installed);
- Pillow's float ("F" mode) resize for the tensor path of ``resize_with_pad`` (the same antialiased filters);
- transformers' Mllama ``get_cross_attention_token_mask`` and ``convert_sparse_cross_attention_mask_to_dense`` for
  the cross-attention masks.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from tests.recipes.test_torchtune_first_losses import torchtune_site  # noqa: F401  (the session fixture)
from tune.models.clip import CLIPImageTransform
from tune.modules.transforms import VisionCrossAttentionMask
from tune.modules.transforms.vision_utils import (
    find_supported_resolutions,
    get_canvas_best_fit,
    get_inscribed_size,
    pad_dim_to_size,
    resize_with_pad,
    tile_crop,
)

mllama = pytest.importorskip("transformers.models.mllama.image_processing_pil_mllama")
mllama_processing = pytest.importorskip("transformers.models.mllama.processing_mllama")

# Llama 3.2 Vision's normalisation (CLIP's)
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
TILE = 28  # a tiny tile keeps the images small; the real 560 is checked below on fewer images

# (height, width): square, portrait, landscape, one-pixel sides, extreme ratios, exact canvases, just above and below
# a tile, and images larger than the largest canvas
SIZES = [
    (1, 1), (1, 300), (300, 1), (5, 7), (28, 28), (27, 29), (29, 27), (56, 28), (28, 56), (100, 30), (30, 100),
    (200, 200), (57, 113), (113, 57), (84, 84), (1000, 20), (20, 1000), (61, 59), (400, 300), (300, 400), (112, 112),
    (29, 85), (123, 45), (55, 55), (2000, 1500),
]  # fmt: skip
# Llama 3.2 Vision's own tile size, with photos' sizes
SIZES_560 = [(480, 640), (1080, 1920), (1920, 1080), (560, 560), (300, 2000), (3000, 1000), (100, 120)]


def _random_image(height: int, width: int, seed: int, mode: str = "RGB") -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    image = Image.fromarray(pixels, mode="RGBA")
    return image if mode == "RGBA" else image.convert(mode)


def _hf(image: Image.Image, tile: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Tiles and (tile rows, tile columns) of transformers' PIL Mllama image processor."""
    processor = mllama.MllamaImageProcessorPil(
        size={"height": tile, "width": tile}, max_image_tiles=4, image_mean=list(MEAN), image_std=list(STD)
    )
    out = processor(image, return_tensors="np")
    num_tiles = out["num_tiles"][0][0]
    ratios = mllama.get_all_supported_aspect_ratios(4)  # its ids index this list of (rows, columns), from 1
    return out["pixel_values"][0, 0, :num_tiles], tuple(ratios[out["aspect_ratio_ids"][0, 0] - 1])


def _ours(tile: int) -> CLIPImageTransform:
    return CLIPImageTransform(image_mean=MEAN, image_std=STD, tile_size=tile, max_num_tiles=4, dtype=torch.float32)


def _check_against_hf(images: list[Image.Image], tile: int) -> float:
    transform, worst = _ours(tile), 0.0
    for image in images:
        expected, ratio = _hf(image, tile)
        out = transform({"image": image})
        assert tuple(out["aspect_ratio"].tolist()) == ratio, image.size
        assert out["aspect_ratio"].dtype == torch.long
        assert out["image"].shape == expected.shape, image.size
        worst = max(worst, float(np.abs(out["image"].numpy() - expected).max()))
    return worst


def test_tiles_equal_hf_mllama_processor(capsys):
    images = [_random_image(h, w, seed) for seed, (h, w) in enumerate(SIZES)]
    worst = _check_against_hf(images, TILE)
    with capsys.disabled():
        print(f"\nCLIPImageTransform vs MllamaImageProcessorPil, {len(images)} images, tile {TILE}: max diff {worst}")
    assert worst <= 1e-6


def test_tiles_equal_hf_mllama_processor_at_560(capsys):
    images = [_random_image(h, w, seed) for seed, (h, w) in enumerate(SIZES_560)]
    worst = _check_against_hf(images, 560)
    with capsys.disabled():
        print(f"\nCLIPImageTransform vs MllamaImageProcessorPil, {len(images)} images, tile 560: max diff {worst}")
    assert worst <= 1e-6


def test_image_modes_are_converted_as_hf_does():
    # transparency composited onto white, grayscale and palette images expanded to RGB
    images = [_random_image(40, 70, 1, mode) for mode in ("RGBA", "LA", "L", "P", "CMYK", "1")]
    assert _check_against_hf(images, TILE) <= 1e-6


def test_uint8_tensor_is_the_pil_image():
    image = _random_image(45, 100, 3)
    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1)  # [3, H, W] uint8
    ours, expected = _ours(TILE)({"image": tensor}), _ours(TILE)({"image": image})
    assert torch.equal(ours["image"], expected["image"])
    assert torch.equal(ours["aspect_ratio"], expected["aspect_ratio"])
    gray = torch.from_numpy(np.array(image.convert("L")))  # [H, W] is one channel
    assert torch.equal(_ours(TILE)({"image": gray})["image"], _ours(TILE)({"image": image.convert("L")})["image"])


def test_float_tensor_is_resized_in_float():
    # the torch path (torchtune's numerics) differs from Pillow's uint8 resize by its rounding only: at most
    # about two uint8 steps after the two resampling passes, divided by the smallest std
    image = _random_image(45, 100, 4)
    floats = torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255
    ours, expected = _ours(TILE)({"image": floats}), _ours(TILE)({"image": image})
    assert torch.equal(ours["aspect_ratio"], expected["aspect_ratio"])
    assert (ours["image"] - expected["image"]).abs().max() <= 2.5 / 255 / min(STD)


def test_dtype_and_no_normalisation():
    image = _random_image(20, 50, 5)
    out = CLIPImageTransform(tile_size=TILE, max_num_tiles=4)({"image": image, "other": 1})
    assert out["image"].dtype == torch.bfloat16 and out["other"] == 1  # torchtune's default dtype
    plain = CLIPImageTransform(tile_size=TILE, max_num_tiles=4, dtype=torch.float32)({"image": image})["image"]
    assert 0 <= plain.min() and plain.max() <= 1


def test_resize_to_max_canvas_and_possible_resolutions():
    # a 10x30 image: the largest 4-tile canvas of its shape is 1x3 tiles, grown to fill it
    image = _random_image(10, 30, 6)
    out = CLIPImageTransform(tile_size=TILE, max_num_tiles=4, resize_to_max_canvas=True)({"image": image})
    assert out["aspect_ratio"].tolist() == [1, 3] and out["image"].shape[0] == 3
    fixed = CLIPImageTransform(tile_size=TILE, possible_resolutions=[(56, 56)], max_num_tiles=None)
    assert fixed({"image": image})["aspect_ratio"].tolist() == [2, 2]


# ---- vision_utils against torchtune 0.6.1 and transformers ----------------------------------------------------

_TORCHTUNE_SCRIPT = """
import importlib, json, sys
try:
    importlib.import_module("torchao.dtypes.nf4tensor")
except ImportError:  # torchtune 0.6.1 imports a torchao module that later releases moved
    sys.modules["torchao.dtypes.nf4tensor"] = importlib.import_module(
        "torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
import torch
from torchtune.modules.transforms import VisionCrossAttentionMask
from torchtune.modules.transforms.vision_utils.get_canvas_best_fit import (
    find_supported_resolutions, get_canvas_best_fit)
from torchtune.modules.transforms.vision_utils.get_inscribed_size import get_inscribed_size
from torchtune.modules.transforms.vision_utils.pad_dim_to_size import pad_dim_to_size

data = json.load(sys.stdin)
out = {"resolutions": [find_supported_resolutions(n, t) for n, t in data["resolutions"]], "canvases": []}
for max_tiles, tile, grow in data["canvas_settings"]:
    canvases = torch.tensor(find_supported_resolutions(max_tiles, tile))
    out["canvases"].append([list(get_canvas_best_fit(torch.empty(0, h, w), canvases, grow)) for h, w in data["sizes"]])
out["inscribed"] = [list(get_inscribed_size(*case)) for case in data["inscribed"]]
out["padded"] = pad_dim_to_size(torch.arange(6.0).reshape(2, 3), 4, dim=0, fill=-1.0).tolist()
out["masks"] = []
for tokens, tiles in data["masks"]:
    sample = {"tokens": tokens, "encoder_input": {"images": [torch.empty(n, 3, 1, 1) for n in tiles]}}
    masks = VisionCrossAttentionMask(tile_size=4, patch_size=2, image_token_id=9)(sample)["encoder_mask"]
    out["masks"].append([m.int().tolist() for m in masks])
json.dump(out, sys.stdout)
"""

_CANVAS_SETTINGS = [(4, 28, False), (4, 28, True), (6, 28, False), (1, 28, False), (9, 14, True), (4, 560, False)]
_CANVAS_SIZES = SIZES + [(h * 20, w * 20) for h, w in SIZES[:12]] + [(560, 1120), (1119, 561), (47, 2241)]
_INSCRIBED = [((300, 800), (448, 1344), None), ((300, 800), (448, 1344), 600), ((500, 1000), (448, 488), 600),
              ((28, 28), (56, 56), 28), ((10, 300), (28, 112), 28), ((600, 200), (84, 28), None)]  # fmt: skip
# Sample layouts (image token 9): images at the start, between turns, consecutive, text after the last image, an
# image as the last token, no image
LAYOUTS = [
    ([9, 5, 6, 7, 8], [1]),
    ([1, 2, 9, 3, 4, 9, 5, 6], [2, 4]),
    ([9, 9, 5, 6, 9, 7], [1, 3, 2]),
    ([1, 9, 9, 9, 2, 3, 9, 9, 4, 5], [1, 2, 3, 4, 1]),
    ([1, 2, 3, 9], [4]),
    ([1, 9, 2, 9, 9, 3, 9], [2, 1, 1, 3]),
    ([1, 2, 3], []),
]


@pytest.fixture(scope="module")
def torchtune_reference(torchtune_site):  # noqa: F811
    payload = {
        "resolutions": [[n, t] for n in range(1, 10) for t in (14, 224)],
        "canvas_settings": _CANVAS_SETTINGS,
        "sizes": _CANVAS_SIZES,
        "inscribed": _INSCRIBED,
        "masks": LAYOUTS,
    }
    env = {**os.environ, "PYTHONPATH": str(torchtune_site)}
    proc = subprocess.run(
        [sys.executable, "-c", _TORCHTUNE_SCRIPT], input=json.dumps(payload), capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_find_supported_resolutions_equals_torchtune(torchtune_reference):
    ours = [[list(c) for c in find_supported_resolutions(n, t)] for n in range(1, 10) for t in (14, 224)]
    assert ours == torchtune_reference["resolutions"]


def test_get_canvas_best_fit_equals_torchtune_and_hf(torchtune_reference):
    for (max_tiles, tile, grow), expected in zip(_CANVAS_SETTINGS, torchtune_reference["canvases"]):
        canvases = torch.tensor(find_supported_resolutions(max_tiles, tile))
        ours = [list(get_canvas_best_fit(torch.empty(0, h, w), canvases, grow)) for h, w in _CANVAS_SIZES]
        assert ours == expected, (max_tiles, tile, grow)
        if not grow:  # transformers' canvas choice (it never grows to the largest canvas)
            hf = [list(mllama.get_optimal_tiled_canvas(h, w, max_tiles, tile)) for h, w in _CANVAS_SIZES]
            assert ours == hf, (max_tiles, tile)
    # a PIL image and a list of canvases are taken as well
    assert get_canvas_best_fit(Image.new("RGB", (300, 200)), [[224, 448], [448, 224]], False) == (224, 448)


def test_get_inscribed_size_equals_torchtune_and_hf(torchtune_reference):
    assert [list(get_inscribed_size(*case)) for case in _INSCRIBED] == torchtune_reference["inscribed"]
    for h, w in _CANVAS_SIZES:
        canvas = mllama.get_optimal_tiled_canvas(h, w, 4, TILE)
        expected = mllama.get_image_size_fit_to_canvas(h, w, int(canvas[0]), int(canvas[1]), TILE)
        assert get_inscribed_size((h, w), canvas, TILE) == tuple(expected), (h, w)
    # never a zero side, where torchtune's would give one
    assert get_inscribed_size((1, 1000), (28, 112), 28) == (1, 112)


def test_tile_crop_equals_hf_split():
    image = torch.randn(3, 84, 56)
    expected = mllama.split_to_tiles_np(image.numpy(), 3, 2)
    assert np.array_equal(tile_crop(image, 28).numpy(), expected)
    with pytest.raises(ValueError, match="cannot be cut into tiles"):
        tile_crop(image, 40)
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        tile_crop(image[None], 28)


def test_pad_dim_to_size_equals_torchtune(torchtune_reference):
    padded = pad_dim_to_size(torch.arange(6.0).reshape(2, 3), 4, dim=0, fill=-1.0)
    assert padded.tolist() == torchtune_reference["padded"]
    assert pad_dim_to_size(torch.ones(2, 3), 5, dim=-1).shape == (2, 5)
    with pytest.raises(ValueError, match="longer than 1"):
        pad_dim_to_size(torch.ones(2, 3), 1, dim=0)


@pytest.mark.parametrize("resample, pil_filter", [("bilinear", "BILINEAR"), ("bicubic", "BICUBIC")])
def test_resize_with_pad_tensor_equals_pillow_float_resize(resample, pil_filter):
    rng = np.random.default_rng(0)
    for (h, w), target in [((30, 50), (56, 56)), ((300, 500), (56, 112)), ((37, 91), (84, 28)), ((7, 3), (28, 28))]:
        pixels = rng.random((h, w), dtype=np.float32)
        out = resize_with_pad(torch.from_numpy(pixels).expand(3, h, w), target, resample)
        assert out.shape == (3, *target)
        new_h, new_w = get_inscribed_size((h, w), target, None)
        expected = Image.fromarray(pixels, mode="F").resize((new_w, new_h), getattr(Image.Resampling, pil_filter))
        assert np.abs(out[:, :new_h, :new_w].numpy() - np.asarray(expected)).max() < 1e-5
        assert out[:, new_h:].abs().sum() == 0 and out[:, :, new_w:].abs().sum() == 0  # zero padding


def test_resize_with_pad_keeps_kind_and_limits_growth():
    image = Image.new("RGB", (30, 10), (200, 100, 50))
    # 30 wide is already past max_size: the image is not grown, only padded
    out = resize_with_pad(image, (56, 56), "bilinear", max_size=28)
    assert isinstance(out, Image.Image) and out.size == (56, 56)
    assert out.getpixel((29, 9)) == (200, 100, 50) and out.getpixel((30, 0)) == out.getpixel((0, 10)) == (0, 0, 0)
    grown = resize_with_pad(Image.new("RGB", (5, 10), (1, 2, 3)), (56, 56), "bilinear", max_size=28)
    assert grown.getpixel((13, 27)) == (1, 2, 3) and grown.getpixel((14, 0)) == grown.getpixel((0, 28)) == (0, 0, 0)
    uint8 = resize_with_pad(torch.full((3, 10, 30), 7, dtype=torch.uint8), (28, 56), "bilinear")
    assert uint8.dtype == torch.uint8 and uint8[:, :18, :54].eq(7).all() and uint8[:, 19:].eq(0).all()
    with pytest.raises(ValueError, match="only supported for PIL images"):
        resize_with_pad(torch.ones(3, 4, 4), (8, 8), "lanczos")
    with pytest.raises(ValueError, match="resample must be one of"):
        resize_with_pad(image, (8, 8), "cubic")


# ---- VisionCrossAttentionMask ------------------------------------------------------------------------------------


def test_cross_attention_mask_equals_torchtune(torchtune_reference):
    transform = VisionCrossAttentionMask(tile_size=4, patch_size=2, image_token_id=9)
    for (tokens, tiles), expected in zip(LAYOUTS, torchtune_reference["masks"]):
        sample = {"tokens": tokens, "encoder_input": {"images": [torch.empty(n, 3, 4, 4) for n in tiles]}, "x": 1}
        out = transform(sample)
        assert [m.int().tolist() for m in out["encoder_mask"]] == expected, tokens
        assert all(m.dtype == torch.bool for m in out["encoder_mask"]) and out["x"] == 1


def test_cross_attention_mask_equals_hf_mllama():
    # transformers gives [batch, tokens, images, tiles]; each tile is patches_per_tile + 1 image embeddings here
    transform = VisionCrossAttentionMask(tile_size=4, patch_size=2, image_token_id=9)
    for tokens, tiles in LAYOUTS:
        if not tiles:
            continue
        sparse = [mllama_processing.get_cross_attention_token_mask(tokens, 9)]
        dense = mllama_processing.convert_sparse_cross_attention_mask_to_dense(sparse, [tiles], 4, len(tokens))[0]
        sample = {"tokens": tokens, "encoder_input": {"images": [torch.empty(n, 3, 4, 4) for n in tiles]}}
        for index, mask in enumerate(transform(sample)["encoder_mask"]):
            per_tile = torch.from_numpy(dense[:, index, : tiles[index]]).bool()  # [tokens, tiles]
            assert torch.equal(mask, per_tile.repeat_interleave(transform.patches_per_tile + 1, dim=1)), tokens


def test_cross_attention_mask_pads_to_max_num_tiles_at_inference():
    transform = VisionCrossAttentionMask(tile_size=4, patch_size=2, image_token_id=9, max_num_tiles=4)
    sample = {"tokens": [1, 9, 2], "encoder_input": {"images": [torch.empty(2, 3, 4, 4)]}}
    assert transform(sample)["encoder_mask"][0].shape == (3, 10)
    padded = transform(sample, inference=True)["encoder_mask"][0]
    assert padded.shape == (3, 20) and padded[1:, :10].all() and not padded[:, 10:].any() and not padded[0].any()


def test_cross_attention_mask_errors():
    transform = VisionCrossAttentionMask(tile_size=4, patch_size=2, image_token_id=9)
    with pytest.raises(ValueError, match="2 image tokens .* but 1 images"):
        transform({"tokens": [9, 1, 9], "encoder_input": {"images": [torch.empty(1, 3, 4, 4)]}})
    with pytest.raises(ValueError, match="patch_size .* larger than tile_size"):
        VisionCrossAttentionMask(tile_size=4, patch_size=8, image_token_id=9)
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        VisionCrossAttentionMask(tile_size=0, patch_size=2, image_token_id=9)


# ---- errors -----------------------------------------------------------------------------------------------------


def test_clip_transform_errors():
    transform = _ours(TILE)
    with pytest.raises(TypeError, match="PIL.Image.Image or a \\[C, H, W\\] torch.Tensor, got ndarray"):
        transform({"image": np.zeros((10, 10, 3), dtype=np.uint8)})
    with pytest.raises(TypeError, match="got str"):
        transform({"image": "cat.png"})
    with pytest.raises(ValueError, match="channels first"):
        transform({"image": torch.zeros(10, 10, 3)})
    with pytest.raises(ValueError, match="must be uint8"):
        transform({"image": torch.zeros(3, 10, 10, dtype=torch.int32)})
    with pytest.raises(TypeError, match="sample dict"):
        transform(Image.new("RGB", (4, 4)))
    with pytest.raises(ValueError, match="both image_mean and image_std"):
        CLIPImageTransform(image_mean=MEAN, tile_size=TILE)
    with pytest.raises(ValueError, match="not multiples of tile_size"):
        CLIPImageTransform(tile_size=TILE, possible_resolutions=[(28, 30)])
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        CLIPImageTransform(tile_size=0)
    with pytest.raises(ValueError, match="possible_resolutions or max_num_tiles"):
        CLIPImageTransform(tile_size=TILE, max_num_tiles=None)
    with pytest.raises(ValueError, match="resample must be one of"):
        CLIPImageTransform(tile_size=TILE, resample="cubic")
