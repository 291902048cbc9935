"""Image helpers of the tiling image transforms (torchtune's ``torchtune.modules.transforms.vision_utils``): pick
the canvas of tiles an image fits, resize it into the canvas without distortion, cut it into tiles. They work on
tensors and on PIL images, without torchvision."""

from tune.modules.transforms.vision_utils._canvas import (
    find_supported_resolutions,
    get_canvas_best_fit,
    get_inscribed_size,
)
from tune.modules.transforms.vision_utils._resize import resize_with_pad
from tune.modules.transforms.vision_utils._tiles import pad_dim_to_size, tile_crop

__all__ = [
    "find_supported_resolutions",
    "get_canvas_best_fit",
    "get_inscribed_size",
    "pad_dim_to_size",
    "resize_with_pad",
    "tile_crop",
]
