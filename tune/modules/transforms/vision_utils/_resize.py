"""Resizing an image into a canvas without distortion, for tensors (``torch.nn.functional.interpolate``, the
numerics of torchvision's tensor resize) and PIL images (Pillow's filters, the numerics of the Hugging Face PIL
image processors)."""

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tune.modules.transforms.vision_utils._canvas import get_inscribed_size, image_size

# resample name -> torch.nn.functional.interpolate mode (torchvision's InterpolationMode names). "nearest" is
# torch's legacy nearest; "nearest_exact" takes the source pixel under each output pixel's centre.
_TORCH_MODES = {"nearest": "nearest", "nearest_exact": "nearest-exact", "bilinear": "bilinear", "bicubic": "bicubic"}
# resample name -> Pillow filter name (Pillow has one nearest filter, for both nearest names)
_PIL_FILTERS = {
    "nearest": "NEAREST",
    "nearest_exact": "NEAREST",
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "box": "BOX",
    "hamming": "HAMMING",
    "lanczos": "LANCZOS",
}


def resample_name(resample: Any) -> str:
    """The lower-case name of a resampling method given as a string (``"bilinear"``) or an enum whose value is one
    (torchvision's ``InterpolationMode.BILINEAR``).

    Raises:
        ValueError: for a name no backend supports.
    """
    name = getattr(resample, "value", resample)
    if not isinstance(name, str) or name.lower().replace("-", "_") not in _PIL_FILTERS:
        raise ValueError(f"resample must be one of {sorted(_PIL_FILTERS)}, got {resample!r}.")
    return name.lower().replace("-", "_")


def resize_with_pad(
    image: Any, target_size: Sequence[int], resample: Any = "bilinear", max_size: int | None = None
) -> Any:
    """Resizes an image to fit ``target_size`` without distortion, then pads its right and bottom with zeros (black)
    to exactly ``target_size``.

    Args:
        image (torch.Tensor | PIL.Image.Image): ``[..., H, W]`` tensor (float: values kept as they are, uint8:
            rounded back to uint8), or a PIL image.
        target_size (Sequence[int]): ``(height, width)`` of the result.
        resample (str): ``"nearest"``, ``"nearest_exact"``, ``"bilinear"`` or ``"bicubic"`` (PIL images also take
            ``"box"``, ``"hamming"``, ``"lanczos"``), or torchvision's ``InterpolationMode`` of one of them.
            Shrinking antialiases (Pillow always does; tensors with bilinear and bicubic). Default ``"bilinear"``.
        max_size (int | None): limits growth, see :func:`get_inscribed_size`. None: grow to the target.

    Returns:
        torch.Tensor | PIL.Image.Image: the same kind as ``image``, ``target_size`` high and wide.

    Raises:
        ValueError: for an unknown ``resample`` or one tensors do not support.
        TypeError: if ``image`` is neither a tensor nor a PIL image.
    """
    name = resample_name(resample)
    new_size = get_inscribed_size(image_size(image), target_size, max_size)
    target_height, target_width = int(target_size[0]), int(target_size[1])
    if isinstance(image, torch.Tensor):
        resized = _resize_tensor(image, new_size, name)
        # F.pad takes (left, right, top, bottom) for the last two dimensions
        return F.pad(resized, (0, target_width - new_size[1], 0, target_height - new_size[0]))
    from PIL import Image

    resized = image.resize((new_size[1], new_size[0]), resample=getattr(Image.Resampling, _PIL_FILTERS[name]))
    if new_size == (target_height, target_width):
        return resized
    canvas = Image.new(resized.mode, (target_width, target_height))  # all channels 0
    canvas.paste(resized, (0, 0))
    return canvas


def _resize_tensor(image: torch.Tensor, size: tuple[int, int], name: str) -> torch.Tensor:
    if name not in _TORCH_MODES:
        raise ValueError(f"resample={name!r} is only supported for PIL images; tensors take {sorted(_TORCH_MODES)}.")
    mode = _TORCH_MODES[name]
    leading = image.shape[:-2]
    batch = image.reshape(-1, 1, *image.shape[-2:])  # [n, 1, H, W]: interpolate wants a batch and channels
    values = batch if batch.is_floating_point() else batch.float()
    smooth = mode in ("bilinear", "bicubic")
    out = F.interpolate(values, size=size, mode=mode, **({"align_corners": False, "antialias": True} if smooth else {}))
    if not batch.is_floating_point():
        out = out.round_().clamp_(torch.iinfo(batch.dtype).min, torch.iinfo(batch.dtype).max).to(batch.dtype)
    return out.reshape(*leading, *size)
