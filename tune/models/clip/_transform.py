"""CLIP's tiling image transform (Llama 3.2 Vision's image preprocessing): an image of any size becomes up to
``max_num_tiles`` normalised square tiles plus the tile grid's shape."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tune.modules.transforms.vision_utils import (
    find_supported_resolutions,
    get_canvas_best_fit,
    resize_with_pad,
    tile_crop,
)
from tune.modules.transforms.vision_utils._resize import resample_name


class CLIPImageTransform:
    """Resizes an image without distortion into the best canvas of tiles, pads it, normalises it and cuts it into
    tiles (torchtune's class).

    The canvas is the one of ``possible_resolutions`` (or of every grid of at most ``max_num_tiles`` tiles) that
    needs the least shrinking, or the least growth when the image can grow (see
    :func:`~tune.modules.transforms.vision_utils.get_canvas_best_fit`). An image smaller than a tile grows to fill
    one tile side; a larger one is not grown unless ``resize_to_max_canvas``. The image goes to the top left of the
    canvas, the rest is black before normalisation.

    PIL images (and uint8 tensors) are resized with Pillow and rescaled by 1/255 in float64 before normalising in
    float32, the steps of ``MllamaImageProcessorPil`` in Hugging Face transformers, whose tiles these equal (within
    float32 rounding). Transparency is composited onto white, as there. Float tensors (values in [0, 1]) are
    resized with ``torch.nn.functional.interpolate`` (antialiased), the numerics of torchvision's tensor resize that
    torchtune uses.

    Args:
        image_mean (Sequence[float] | None): per-channel mean to subtract; None (with ``image_std`` None) leaves the
            values in [0, 1]. Default None.
        image_std (Sequence[float] | None): per-channel standard deviation to divide by. Default None.
        possible_resolutions (Sequence[tuple[int, int]] | None): canvases ``(height, width)``, multiples of
            ``tile_size``. Default None: every grid of at most ``max_num_tiles`` tiles.
        tile_size (int): side of a tile in pixels. Default 224.
        max_num_tiles (int | None): most tiles per image when ``possible_resolutions`` is None. Default 4.
        dtype (torch.dtype): dtype of the tiles. Default ``torch.bfloat16`` (torchtune's).
        resample (str): ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"`` or ``"nearest_exact"`` (PIL images
            also take ``"box"``, ``"hamming"``, ``"lanczos"``).
        resize_to_max_canvas (bool): grow every image to the largest canvas that fits its shape. Default False.

    Raises:
        ValueError: for a non-positive ``tile_size``, neither ``possible_resolutions`` nor ``max_num_tiles``, a
            canvas that is not a multiple of ``tile_size``, only one of ``image_mean``/``image_std``, a zero
            standard deviation, or an unknown ``resample``.

    Example:
        >>> transform = CLIPImageTransform(tile_size=224, max_num_tiles=4, dtype=torch.float32)
        >>> out = transform({"image": PIL.Image.new("RGB", (400, 200))})
        >>> out["image"].shape, out["aspect_ratio"].tolist()  # a 224x448 canvas: one row of two tiles
        (torch.Size([2, 3, 224, 224]), [1, 2])
    """

    def __init__(
        self,
        *,
        image_mean: Sequence[float] | None = None,
        image_std: Sequence[float] | None = None,
        possible_resolutions: Sequence[tuple[int, int]] | None = None,
        tile_size: int = 224,
        max_num_tiles: int | None = 4,
        dtype: torch.dtype = torch.bfloat16,
        resample: str = "bilinear",
        resize_to_max_canvas: bool = False,
    ) -> None:
        if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
            raise ValueError(f"tile_size must be a positive integer, got {tile_size!r}.")
        if not possible_resolutions:
            if max_num_tiles is None:
                raise ValueError("give possible_resolutions or max_num_tiles: both are None.")
            possible_resolutions = find_supported_resolutions(max_num_tiles, tile_size)
        canvases = [(int(h), int(w)) for h, w in possible_resolutions]
        bad = [c for c in canvases if c[0] < tile_size or c[1] < tile_size or c[0] % tile_size or c[1] % tile_size]
        if bad:
            raise ValueError(f"possible_resolutions {bad} are not multiples of tile_size={tile_size}.")
        if (image_mean is None) != (image_std is None):
            raise ValueError(
                f"give both image_mean and image_std, or neither; got image_mean={image_mean!r}, "
                f"image_std={image_std!r}."
            )
        if image_std is not None and any(s == 0 for s in image_std):
            raise ValueError(f"image_std holds a zero: {list(image_std)}.")
        self.possible_resolutions = torch.tensor(canvases).reshape(-1, 2)
        self.tile_size = tile_size
        self.max_num_tiles = max_num_tiles
        self.mean = None if image_mean is None else list(image_mean)
        self.std = None if image_std is None else list(image_std)
        self.dtype = dtype
        self.resample = resample_name(resample)
        self.resize_to_max_canvas = resize_to_max_canvas
        # without resize_to_max_canvas a side shorter than a tile grows to a tile's length at most
        self.max_size = None if resize_to_max_canvas else tile_size

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Tiles ``sample["image"]``.

        Args:
            sample (Mapping[str, Any]): holds ``"image"``: a ``PIL.Image.Image`` (any mode) or a ``[C, H, W]``
                tensor with 1 or 3 channels (uint8, or float in [0, 1]).
            inference (bool): unused; the transform is the same for training and generation.

        Returns:
            dict[str, Any]: the sample with ``"image"`` replaced by the tiles ``[n_tiles, 3, tile_size,
            tile_size]`` and ``"aspect_ratio"`` added: ``[2]`` int64, the tile grid's (rows, columns).

        Raises:
            TypeError: if the image is neither a PIL image nor a tensor, or ``sample`` is not a mapping.
            ValueError: for a tensor of another shape, or an image with a zero side.
        """
        if not isinstance(sample, Mapping):
            raise TypeError(f"CLIPImageTransform takes a sample dict {{'image': ...}}, got {type(sample).__name__}.")
        image = _as_rgb(sample["image"])
        canvas = get_canvas_best_fit(image, self.possible_resolutions, self.resize_to_max_canvas)
        padded = resize_with_pad(image, canvas, self.resample, self.max_size)
        if isinstance(padded, torch.Tensor):
            pixels = padded.float()  # [3, H, W] in [0, 1]
        else:
            # Pillow gives [H, W, 3] uint8; rescaled in float64 and rounded once to float32, as HF does
            pixels = torch.from_numpy(np.array(padded)).permute(2, 0, 1).double().mul_(1 / 255).float()
        if self.mean is not None:
            mean = torch.tensor(self.mean, dtype=torch.float32).reshape(-1, 1, 1)
            std = torch.tensor(self.std, dtype=torch.float32).reshape(-1, 1, 1)
            pixels = (pixels - mean) / std
        tiles = tile_crop(pixels, self.tile_size).to(self.dtype)  # [n_tiles, 3, tile_size, tile_size]
        aspect_ratio = torch.tensor(canvas, dtype=torch.long) // self.tile_size
        return {**sample, "image": tiles, "aspect_ratio": aspect_ratio}


def _as_rgb(image: Any) -> Any:
    """A PIL image in RGB mode (from a PIL image or a uint8 tensor), or a float ``[3, H, W]`` tensor."""
    if isinstance(image, torch.Tensor):
        if image.dim() == 2:
            image = image.unsqueeze(0)
        if image.dim() != 3 or image.shape[0] not in (1, 3):
            raise ValueError(
                f"an image tensor must be [C, H, W] with 1 or 3 channels (channels first), got shape "
                f"{tuple(image.shape)}."
            )
        if min(image.shape[1:]) < 1:
            raise ValueError(f"the image is {image.shape[1]}x{image.shape[2]} pixels; it needs at least one pixel.")
        image = image.expand(3, -1, -1)
        if image.is_floating_point():
            return image
        if image.dtype != torch.uint8:
            raise ValueError(f"an integer image tensor must be uint8 (0-255), got {image.dtype}.")
        from PIL import Image

        return Image.fromarray(image.permute(1, 2, 0).contiguous().numpy())
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image is None or not isinstance(image, Image.Image):
        raise TypeError(
            f"an image must be a PIL.Image.Image or a [C, H, W] torch.Tensor, got {type(image).__name__}; load files "
            "with tune.data.load_image, and wrap a numpy array with PIL.Image.fromarray."
        )
    if image.width < 1 or image.height < 1:
        raise ValueError(f"the image is {image.width}x{image.height} pixels; it needs at least one pixel.")
    if "A" in image.getbands() or "transparency" in image.info:
        # transparent pixels become white, as the Hugging Face image processors composite them
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
