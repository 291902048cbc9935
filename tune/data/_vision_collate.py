"""Collating samples with images: text padded as for fine-tuning, images batched in the layout their model reads.

Two layouts:

- :func:`padded_collate_tiled_images_and_mask` (torchtune's, for Llama 3.2 Vision): each image is cut into tiles;
  images are padded with empty tiles to the batch's most tiles and rows with empty images to the batch's most
  images, and each row's cross-attention masks (text tokens x image tokens) are padded to match.
- :func:`padded_collate_images` (Gemma 3, Qwen2.5-VL): every tensor of the samples' ``encoder_input`` is joined
  along its first dimension, row after row, since these models find each image's place by its tokens.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from tune.data._collate import left_pad_sequence, padded_collate_sft
from tune.data._common import CROSS_ENTROPY_IGNORE_IDX


def padded_collate_tiled_images_and_mask(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    pad_direction: str = "right",
    pad_max_tiles: int | None = None,
    pad_max_images: int | None = None,
) -> dict[str, Any]:
    """Pads text, tiled images, aspect ratios and cross-attention masks of samples into one batch (torchtune's
    collate for Llama 3.2 Vision, training and generation).

    Each sample holds ``tokens`` (and ``labels`` for training) of its own length ``s_i``,
    ``encoder_input={"images": [Tensor[n_tiles, c, h, w], ...], "aspect_ratio": [Tensor[2], ...]}`` and
    ``encoder_mask=[Tensor[s_i, n_tiles * tokens_per_tile], ...]``, one entry per image. Images are padded with
    zero tiles to the batch's most tiles, rows with zero images (aspect ratio ``(1, 1)``) to its most images, and
    each mask with False for the padded tiles and text; a row's masks are then joined along the image tokens (image
    i's in columns ``i * max_tiles * tokens_per_tile`` on; torchtune 0.6.1 reshapes the stacked masks instead, which
    mixes the masks of a row with two images or more). Unlike torchtune's, a row without images is accepted (its
    masks are all False); a batch without any image gives
    ``encoder_input`` and ``encoder_mask`` None (text only).

    Args:
        batch (Sequence[dict[str, Any]]): the samples.
        padding_idx (int): token id for padding. Default 0.
        ignore_idx (int): label for padding. Default -100.
        pad_direction (str): ``"right"`` for training; ``"left"`` for generation (every prompt ends at the last
            column; ``labels`` are then left out). Default "right".
        pad_max_tiles (int | None): pad images to this many tiles instead of the batch's most. Default None.
        pad_max_images (int | None): pad the masks' image dimension to this many images (the images themselves
            stay at the batch's most, as in torchtune). Default None.

    Returns:
        dict[str, Any]: ``tokens`` [b, s] (and ``labels`` [b, s] with right padding), ``encoder_input`` with
        ``images`` [b, max_images, max_tiles, c, h, w] and ``aspect_ratio`` [b, max_images, 2], and
        ``encoder_mask`` [b, s, max_images * max_tiles * tokens_per_tile] (``pad_max_images`` in place of
        ``max_images`` when given).

    Raises:
        ValueError: for an unknown ``pad_direction``, a ``pad_max_tiles`` or ``pad_max_images`` below the batch's
            count, samples whose images, aspect ratios and masks differ in number, or masks that disagree with
            their image's tiles or tokens.
    """
    if pad_direction not in ("left", "right"):
        raise ValueError(f"pad_direction must be 'left' or 'right', got {pad_direction!r}.")
    if pad_direction == "right":
        text = padded_collate_sft(
            [{"tokens": sample["tokens"], "labels": sample["labels"]} for sample in batch], padding_idx, ignore_idx
        )
    else:  # generation: no labels
        text = {
            "tokens": left_pad_sequence(
                [torch.as_tensor(sample["tokens"], dtype=torch.long) for sample in batch],
                batch_first=True,
                padding_value=padding_idx,
            )
        }
    seq_len = text["tokens"].shape[1]
    rows = [_tiled_row(index, sample) for index, sample in enumerate(batch)]
    all_images = [image for images, _, _ in rows for image in images]
    if not all_images:
        return {**text, "encoder_input": None, "encoder_mask": None}
    max_tiles = max(image.shape[0] for image in all_images)
    if pad_max_tiles is not None:
        if pad_max_tiles < max_tiles:
            raise ValueError(f"An image of the batch has {max_tiles} tiles, more than pad_max_tiles={pad_max_tiles}.")
        max_tiles = pad_max_tiles
    tile_shape = tuple(all_images[0].shape[1:])  # (c, h, w)
    tokens_per_tile = _tokens_per_tile(rows)

    images, aspect_ratios, masks = [], [], []
    for (row_images, row_ratios, row_masks), sample in zip(rows, batch, strict=True):
        text_len = len(sample["tokens"])
        before, after = (seq_len - text_len, 0) if pad_direction == "left" else (0, seq_len - text_len)
        # [n_images, max_tiles, c, h, w]; zero tiles after an image's own
        padded = [F.pad(image, (0, 0, 0, 0, 0, 0, 0, max_tiles - image.shape[0])) for image in row_images]
        images.append(torch.stack(padded) if padded else all_images[0].new_zeros(0, max_tiles, *tile_shape))
        # [n_images, seq_len, max_tiles * tokens_per_tile]; False for padded text and tiles
        padded_masks = [
            F.pad(mask, (0, (max_tiles - image.shape[0]) * tokens_per_tile, before, after), value=False)
            for image, mask in zip(row_images, row_masks, strict=True)
        ]
        empty_mask = torch.zeros(0, seq_len, max_tiles * tokens_per_tile, dtype=_mask_dtype(rows))
        masks.append(torch.stack(padded_masks) if padded_masks else empty_mask)
        aspect_ratios.append(torch.stack(row_ratios) if row_ratios else torch.zeros(0, 2, dtype=_ratio_dtype(rows)))

    num_images = max(len(row_images) for row_images, _, _ in rows)
    if pad_max_images is not None and pad_max_images < num_images:
        raise ValueError(f"A sample of the batch has {num_images} images, more than pad_max_images={pad_max_images}.")
    collated_images = pad_sequence(images, batch_first=True, padding_value=0)  # [b, max_images, max_tiles, c, h, w]
    collated_ratios = pad_sequence(aspect_ratios, batch_first=True, padding_value=1)  # [b, max_images, 2]
    collated_masks = pad_sequence(masks, batch_first=True, padding_value=False)  # [b, max_images, s, image_len]
    # each row's masks side by side along the image tokens: [b, s, max_images * image_len]
    encoder_mask = collated_masks.permute(0, 2, 1, 3).reshape(len(batch), seq_len, -1)
    if pad_max_images is not None:
        encoder_mask = F.pad(encoder_mask, (0, pad_max_images * max_tiles * tokens_per_tile - encoder_mask.shape[2]))
    return {
        **text,
        "encoder_input": {"images": collated_images, "aspect_ratio": collated_ratios},
        "encoder_mask": encoder_mask,
    }


def _tiled_row(index: int, sample: Mapping[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor], list]:
    """A sample's images, aspect ratios and masks, checked to agree in number and size."""
    encoder_input = sample.get("encoder_input")
    encoder_input = {} if encoder_input is None else encoder_input
    images = list(_or_empty(encoder_input.get("images")))
    ratios = [torch.as_tensor(ratio) for ratio in _or_empty(encoder_input.get("aspect_ratio"))]
    masks = list(_or_empty(sample.get("encoder_mask")))
    if not len(images) == len(ratios) == len(masks):
        raise ValueError(
            f"Sample {index} of the batch has {len(images)} images, {len(ratios)} aspect ratios and {len(masks)} "
            "encoder masks; a model transform gives one of each per image."
        )
    for image, mask in zip(images, masks, strict=True):
        if image.dim() != 4 or mask.dim() != 2 or mask.shape[0] != len(sample["tokens"]):
            raise ValueError(
                f"Sample {index} of the batch: an image must be [n_tiles, c, h, w] and its encoder mask [seq_len, "
                f"n_tiles * tokens_per_tile] with seq_len {len(sample['tokens'])}, got image {tuple(image.shape)} and "
                f"mask {tuple(mask.shape)}."
            )
    return images, ratios, masks


def _or_empty(value: Any) -> Any:
    return [] if value is None else value


def _tokens_per_tile(rows: list[tuple[list, list, list]]) -> int:
    counts = {mask.shape[1] // image.shape[0] for images, _, masks in rows for image, mask in zip(images, masks)}
    exact = all(mask.shape[1] % image.shape[0] == 0 for images, _, masks in rows for image, mask in zip(images, masks))
    if len(counts) != 1 or not exact:
        raise ValueError(
            "The encoder masks of the batch disagree on the image tokens per tile (mask width / tiles); every image "
            "must come from the same image transform."
        )
    return counts.pop()


def _mask_dtype(rows: list[tuple[list, list, list]]) -> torch.dtype:
    return next(mask.dtype for _, _, masks in rows for mask in masks)


def _ratio_dtype(rows: list[tuple[list, list, list]]) -> torch.dtype:
    return next(ratio.dtype for _, ratios, _ in rows for ratio in ratios)


def padded_collate_images(
    batch: Sequence[dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    pad_to_multiple_of: int = 1,
) -> dict[str, Any]:
    """Pads text as :func:`~tune.data.padded_collate_sft` and joins the samples' images in one flat batch (the
    layout of Gemma 3 and Qwen2.5-VL, which place each image by its tokens).

    Every tensor of each sample's ``encoder_input`` is concatenated with the others of its key along dim 0, row
    after row: Gemma 3's ``images`` [n_images, 3, H, W] become [sum n_images, 3, H, W], Qwen2.5-VL's
    ``pixel_values`` [n_patches, 1176] and ``image_grid_thw`` [n_images, 3] likewise. A row without images (no
    ``encoder_input``, or tensors with 0 rows) adds nothing; when no sample has an ``encoder_input`` the batch's is
    None, and when the samples have one but no images, its tensors have 0 rows (both read as text only).

    Args:
        batch (Sequence[dict[str, Any]]): samples with ``tokens``, ``labels`` and optionally ``encoder_input``.
        padding_idx (int): token id for padding. Default 0.
        ignore_idx (int): label for padding. Default -100.
        pad_to_multiple_of (int): round the padded length up to a multiple of this. Default 1.

    Returns:
        dict[str, Any]: ``tokens`` and ``labels`` int64 [b, s], and ``encoder_input`` (a dict of the joined tensors,
        or None).

    Raises:
        ValueError: as :func:`~tune.data.padded_collate_sft`, or for samples whose ``encoder_input`` have different
            keys or a value that is not a tensor.
    """
    out: dict[str, Any] = padded_collate_sft(
        [{"tokens": sample["tokens"], "labels": sample["labels"]} for sample in batch],
        padding_idx,
        ignore_idx,
        pad_to_multiple_of,
    )
    inputs = [(index, sample.get("encoder_input")) for index, sample in enumerate(batch)]
    inputs = [(index, encoder_input) for index, encoder_input in inputs if encoder_input is not None]
    if not inputs:
        out["encoder_input"] = None
        return out
    keys = sorted(inputs[0][1])
    for index, encoder_input in inputs:
        if sorted(encoder_input) != keys:
            raise ValueError(
                f"Sample {index} of the batch has encoder_input keys {sorted(encoder_input)}, sample {inputs[0][0]} "
                f"has {keys}; every sample must come from the same model transform."
            )
        for key, value in encoder_input.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"Sample {index} of the batch has encoder_input[{key!r}] of type {type(value).__name__}; "
                    "padded_collate_images joins tensors (for tiled images use padded_collate_tiled_images_and_mask)."
                )
    out["encoder_input"] = {key: torch.cat([encoder_input[key] for _, encoder_input in inputs]) for key in keys}
    return out
