"""Choosing the tiled canvas an image is resized into, and the size it takes inside it."""

import math
from collections.abc import Sequence
from typing import Any

import torch


def find_supported_resolutions(max_num_tiles: int, tile_size: int) -> list[tuple[int, int]]:
    """Every canvas ``(height, width)`` made of at most ``max_num_tiles`` tiles of ``tile_size`` pixels.

    The canvases are grouped by aspect ratio, in the order torchtune lists them (so that a tie in
    :func:`get_canvas_best_fit` picks the same canvas): the tile counts go from ``max_num_tiles`` down to 1, the
    splits of each count by increasing number of tile rows.

    Args:
        max_num_tiles (int): the most tiles a canvas holds.
        tile_size (int): the side of a tile in pixels.

    Returns:
        list[tuple[int, int]]: canvases in pixels; with 4 tiles of 224: ``[(224, 896), (448, 448), (224, 224),
        (896, 224), (224, 672), (672, 224), (224, 448), (448, 224)]``.

    Raises:
        ValueError: if either argument is not a positive integer.
    """
    _check_positive("max_num_tiles", max_num_tiles)
    _check_positive("tile_size", tile_size)
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for num_tiles in range(max_num_tiles, 0, -1):
        for rows in range(1, num_tiles + 1):
            if num_tiles % rows == 0:
                columns = num_tiles // rows
                by_ratio.setdefault(rows / columns, []).append((rows * tile_size, columns * tile_size))
    return [canvas for canvases in by_ratio.values() for canvas in canvases]


def get_canvas_best_fit(
    image: Any, possible_resolutions: "torch.Tensor | Sequence[Sequence[int]]", resize_to_max_canvas: bool
) -> tuple[int, int]:
    """The canvas an image fits best without distortion.

    Each canvas allows scaling the image by the smaller of its height and width ratios. Among the canvases that
    let the image grow (scale >= 1), the one with the smallest scale is chosen, or the largest with
    ``resize_to_max_canvas``; when every canvas shrinks the image, the one that shrinks it least. Canvases with
    the chosen scale are told apart by their area, the smallest one winning (least padding). Scales are compared
    in float64, as the Hugging Face Mllama image processor does.

    Args:
        image (torch.Tensor | PIL.Image.Image): the image, ``[..., H, W]`` as a tensor.
        possible_resolutions (torch.Tensor | Sequence[Sequence[int]]): ``[N, 2]`` canvases as ``(height, width)``.
        resize_to_max_canvas (bool): pick the canvas that scales the image up the most.

    Returns:
        tuple[int, int]: the chosen canvas ``(height, width)``.

    Raises:
        ValueError: if there is no canvas, or the image has a zero side.
    """
    height, width = image_size(image)
    if height < 1 or width < 1:
        raise ValueError(f"the image is {height}x{width} pixels; an image needs at least one pixel on each side.")
    canvases = [(int(h), int(w)) for h, w in torch.as_tensor(possible_resolutions).reshape(-1, 2).tolist()]
    if not canvases:
        raise ValueError("possible_resolutions is empty; give at least one (height, width) canvas.")
    scales = [min(h / height, w / width) for h, w in canvases]
    growing = [s for s in scales if s >= 1]
    if growing:
        chosen = max(growing) if resize_to_max_canvas else min(growing)
    else:
        chosen = max(scales)
    # the first canvas of least area among those with the chosen scale (the order breaks ties)
    candidates = [canvas for canvas, scale in zip(canvases, scales) if scale == chosen]
    return min(candidates, key=lambda canvas: canvas[0] * canvas[1])


def get_inscribed_size(image_size: Sequence[int], target_size: Sequence[int], max_size: int | None) -> tuple[int, int]:
    """The size of an image scaled, without distortion, until one side meets ``target_size``.

    Args:
        image_size (Sequence[int]): ``(height, width)`` of the image.
        target_size (Sequence[int]): ``(height, width)`` to fit in.
        max_size (int | None): a side is not grown past the larger of its own length and ``max_size`` (so a small
            image grows to ``max_size`` at most, and one already larger is not grown). None: grow to the target.

    Returns:
        tuple[int, int]: ``(height, width)``, each at least 1 and at most the (bounded) target's.

    Raises:
        ValueError: if a size does not have two entries.
    """
    if len(image_size) != 2 or len(target_size) != 2:
        raise ValueError(
            f"image_size and target_size must be (height, width) pairs, got {tuple(image_size)} and "
            f"{tuple(target_size)}."
        )
    height, width = int(image_size[0]), int(image_size[1])
    target_height, target_width = int(target_size[0]), int(target_size[1])
    if max_size is not None:
        target_height = min(max(height, max_size), target_height)
        target_width = min(max(width, max_size), target_width)
    scale_height, scale_width = target_height / height, target_width / width
    # the limiting side meets the target exactly; the other is floored (but never to 0 pixels: a 1x1000 image)
    if scale_width < scale_height:
        return min(max(math.floor(height * scale_width), 1), target_height), target_width
    return target_height, min(max(math.floor(width * scale_height), 1), target_width)


def image_size(image: Any) -> tuple[int, int]:
    """``(height, width)`` of a tensor ``[..., H, W]`` or a PIL image."""
    if isinstance(image, torch.Tensor):
        if image.dim() < 2:
            raise ValueError(
                f"an image tensor needs at least 2 dimensions [..., H, W], got shape {tuple(image.shape)}."
            )
        return int(image.shape[-2]), int(image.shape[-1])
    size = getattr(image, "size", None)
    if isinstance(size, tuple) and len(size) == 2:  # PIL gives (width, height)
        return int(size[1]), int(size[0])
    raise TypeError(f"an image must be a torch.Tensor [..., H, W] or a PIL.Image.Image, got {type(image).__name__}.")


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
