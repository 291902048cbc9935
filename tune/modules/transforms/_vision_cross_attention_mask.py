"""Which images each text token attends to in a cross-attention (Flamingo-style) vision-language model."""

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class VisionCrossAttentionMask:
    """Builds the text-to-image cross-attention masks of a sample (torchtune's class; Llama 3.2 Vision's rule).

    A text token attends to the image of the closest image token at or before it, and to every image of the run of
    consecutive image tokens that image belongs to: ``<img1><img2> two dogs <img3> a cat`` lets ``two dogs`` see
    images 1 and 2 and ``a cat`` see image 3 only (Alayrac et al., 2022, Fig. 7). Tokens before the first image
    token see no image. The image tokens themselves are included. This is the rule of ``MllamaProcessor`` in
    Hugging Face transformers.

    Args:
        tile_size (int): side of the image tiles, in pixels.
        patch_size (int): side of the vision encoder's patches; a tile gives ``(tile_size // patch_size) ** 2``
            patch embeddings plus one CLS embedding.
        image_token_id (int): the id of the image token (``<|image|>``).
        max_num_tiles (int | None): with ``inference=True``, every mask is this many tiles wide, as a generation KV
            cache of the image embeddings is. Default None: each image's own number of tiles.

    Raises:
        ValueError: if a size is not a positive integer or the patch is larger than the tile.
    """

    def __init__(self, tile_size: int, patch_size: int, image_token_id: int, max_num_tiles: int | None = None) -> None:
        for name, value in (("tile_size", tile_size), ("patch_size", patch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if patch_size > tile_size:
            raise ValueError(f"patch_size ({patch_size}) is larger than tile_size ({tile_size}).")
        if max_num_tiles is not None and (not isinstance(max_num_tiles, int) or max_num_tiles < 1):
            raise ValueError(f"max_num_tiles must be a positive integer or None, got {max_num_tiles!r}.")
        self.patches_per_tile = (tile_size // patch_size) ** 2
        self.image_token_id = image_token_id
        self.max_num_tiles = max_num_tiles

    def attention_intervals(self, tokens: Sequence[int]) -> list[tuple[int, int]]:
        """The text positions each image is seen from, one half-open ``(start, end)`` per image token, in order.

        Args:
            tokens (Sequence[int]): the sample's tokens.

        Returns:
            list[tuple[int, int]]: ``start`` is the image's token; ``end`` is the next image token that does not
            directly follow (the end of the next run of image tokens' start), or ``len(tokens)``.

        Example:
            >>> VisionCrossAttentionMask(4, 2, image_token_id=9).attention_intervals([9, 9, 5, 6, 9, 7])
            [(0, 4), (1, 4), (4, 6)]
        """
        positions = [i for i, token in enumerate(tokens) if token == self.image_token_id]
        intervals = []
        end = len(tokens)
        # walk backwards: an image ends where the next run of image tokens starts; images in a run share its end
        for index in range(len(positions) - 1, -1, -1):
            position = positions[index]
            if index + 1 < len(positions) and positions[index + 1] != position + 1:
                end = positions[index + 1]
            intervals.append((position, end))
        return intervals[::-1]

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Adds ``encoder_mask`` to a tokenised sample.

        Args:
            sample (Mapping[str, Any]): holds ``tokens`` (list[int]) and ``encoder_input["images"]``, a list of
                ``[n_tiles, C, H, W]`` tensors (or anything whose ``shape[0]`` is the number of tiles), one per image
                token, in order.
            inference (bool): pad every mask to ``max_num_tiles`` tiles (when set).

        Returns:
            dict[str, Any]: the sample's keys plus ``encoder_mask``: per image a bool tensor
            ``[len(tokens), n_tiles * (patches_per_tile + 1)]``, True where the text token attends to the image.

        Raises:
            ValueError: if the number of image tokens differs from the number of images, or an image has more
                tiles than ``max_num_tiles``.
        """
        tokens, images = sample["tokens"], sample["encoder_input"]["images"]
        intervals = self.attention_intervals(tokens)
        if len(intervals) != len(images):
            raise ValueError(
                f"the sample has {len(intervals)} image tokens (id {self.image_token_id}) but {len(images)} images; "
                "each image needs exactly one image token in the text."
            )
        tokens_per_tile = self.patches_per_tile + 1  # + the CLS embedding
        masks = []
        for (start, end), image in zip(intervals, images):
            num_tiles = int(image.shape[0])
            width = num_tiles * tokens_per_tile
            if inference and self.max_num_tiles is not None:
                if num_tiles > self.max_num_tiles:
                    raise ValueError(f"an image has {num_tiles} tiles, more than max_num_tiles={self.max_num_tiles}.")
                width = self.max_num_tiles * tokens_per_tile
            mask = torch.zeros(len(tokens), width, dtype=torch.bool)  # [text tokens, image embeddings]
            mask[start:end, : num_tiles * tokens_per_tile] = True
            masks.append(mask)
        return {**sample, "encoder_mask": masks}
