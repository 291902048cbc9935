"""Cutting an image into square tiles, and padding a dimension of a tensor."""

import torch
import torch.nn.functional as F


def tile_crop(image: torch.Tensor, tile_size: int) -> torch.Tensor:
    """Cuts an image into ``tile_size`` square tiles, row by row.

    Args:
        image (torch.Tensor): ``[C, H, W]`` with ``H`` and ``W`` multiples of ``tile_size``.
        tile_size (int): the side of a tile in pixels.

    Returns:
        torch.Tensor: ``[H // tile_size * W // tile_size, C, tile_size, tile_size]``, the top row of tiles first.

    Raises:
        ValueError: if ``image`` is not 3-dimensional or its sides are not multiples of ``tile_size``.
    """
    if image.dim() != 3:
        raise ValueError(f"tile_crop takes one image [C, H, W], got shape {tuple(image.shape)}.")
    channels, height, width = image.shape
    if tile_size < 1 or height % tile_size or width % tile_size:
        raise ValueError(f"a {height}x{width} image cannot be cut into tiles of {tile_size}x{tile_size} pixels.")
    rows, columns = height // tile_size, width // tile_size
    tiles = image.reshape(channels, rows, tile_size, columns, tile_size)  # [C, rows, t, columns, t]
    return tiles.permute(1, 3, 0, 2, 4).reshape(rows * columns, channels, tile_size, tile_size)


def pad_dim_to_size(input: torch.Tensor, size: int, dim: int, *, fill: float = 0.0) -> torch.Tensor:
    """Pads dimension ``dim`` of ``input`` at its end with ``fill`` until it is ``size`` long.

    Args:
        input (torch.Tensor): the tensor.
        size (int): the length ``dim`` gets.
        dim (int): the dimension (negative counts from the end).
        fill (float): the value of the new entries. Default 0.0.

    Returns:
        torch.Tensor: ``input`` padded.

    Raises:
        ValueError: if ``dim`` is already longer than ``size``.
    """
    dim = dim % input.dim()
    missing = size - input.shape[dim]
    if missing < 0:
        raise ValueError(f"dimension {dim} of a tensor of shape {tuple(input.shape)} is longer than {size}.")
    # F.pad lists (before, after) pairs from the last dimension backwards
    padding = [0, 0] * (input.dim() - 1 - dim) + [0, missing]
    return F.pad(input, padding, value=fill)
