"""Qwen2.5-VL's vision transformer (Qwen Team, 2025, https://arxiv.org/abs/2502.13923): images of any size in, one
vector per 2 x 2 block of patches out, in the language model's width.

An image is cut into 14 x 14 patches, two frames deep (a still image is its own second frame), and the processor
hands them over flattened (``pixel_values`` [total_patches, channels * 2 * 14 * 14]) with each image's patch grid
(``image_grid_thw`` [n_images, 3]: frames, rows, columns), the patches of each 2 x 2 merge block next to each other.
Patches get 2-D rotary embeddings (half the frequencies turn with the row, half with the column). Most layers
attend within windows of ``window_size`` pixels (112: 4 x 4 merge blocks); the layers in
``full_attention_layers`` attend over the whole image; no layer attends across images. The window layers need the
patches of a window next to each other, so the encoder reorders the merge blocks window by window first and puts
them back in the processor's order at the end. The patch merger RMS-normalises each patch, concatenates the four
of a merge block and maps them through a GELU MLP.

The layers are tune's ``TransformerSelfAttentionLayer``, ``MultiHeadAttention`` (biased projections, no causal
mask) and ``FeedForward`` (biased SwiGLU), so adapters and activation checkpointing treat them like a decoder's.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class VisionRotaryEmbeddings2D(nn.Module):
    """2-D RoPE of an image patch: the first half of the rotated pairs turn with its row, the second half with its
    column, both with the frequencies of a ``dim // 2``-feature RoPE ("rotate half" layout).

    Rotation runs in float32 and the result is cast back to the input dtype, as transformers does.

    Args:
        dim (int): features per head; a multiple of 4.
        base (float): the RoPE theta. Default 10000.

    Raises:
        ValueError: if ``dim`` is not a multiple of 4.
    """

    def __init__(self, dim: int, base: float = 10_000.0) -> None:
        super().__init__()
        if dim % 4:
            raise ValueError(
                f"2-D RoPE splits a head into rows and columns: head_dim must be a multiple of 4, got {dim}."
            )
        self.dim = dim
        self.base = base
        self.register_buffer("inv_freq", torch.empty(dim // 4), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)computes the frequencies, e.g. after building on the meta device and ``to_empty``."""
        device = self.inv_freq.device
        if device.type == "meta":
            return
        half = self.dim // 2
        exponents = torch.arange(0, half, 2, dtype=torch.int64, device=device).float() / half
        with torch.no_grad():
            self.inv_freq.copy_(1.0 / (self.base**exponents))

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Rotates queries or keys ``x`` [b, s, num_heads, dim] by their patches' (row, column) ``input_pos``
        [b, s, 2] int64.

        Raises:
            ValueError: if ``input_pos`` is missing.
        """
        if input_pos is None:
            raise ValueError("VisionRotaryEmbeddings2D needs each patch's (row, column) as input_pos [b, s, 2].")
        angles = (input_pos[..., None].float() * self.inv_freq).flatten(-2)  # [b, s, dim // 2]: rows, then columns
        angles = torch.cat((angles, angles), dim=-1)[:, :, None]  # [b, s, 1, dim]
        x_fp32 = x.float()
        half = self.dim // 2
        rotated = torch.cat((-x_fp32[..., half:], x_fp32[..., :half]), dim=-1)
        return (x_fp32 * angles.cos() + rotated * angles.sin()).type_as(x)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


class QwenPatchMerger(nn.Module):
    """Merge blocks of ``merge_size ** 2`` patches -> one vector in the language model's width:
    ``fc2(GELU(fc1(concat(norm(patch) for patch in block))))``.

    Args:
        norm (nn.Module): per-patch norm (RMSNorm over the vision width).
        fc1 (nn.Module): ``merge_size ** 2 * vision_dim`` -> the same width.
        fc2 (nn.Module): that width -> the language model's width.
        merge_size (int): side of a merge block in patches. Default 2.
    """

    def __init__(self, *, norm: nn.Module, fc1: nn.Module, fc2: nn.Module, merge_size: int = 2) -> None:
        super().__init__()
        self.merge_size = merge_size
        self.norm = norm
        self.fc1 = fc1
        self.activation = nn.GELU()  # exact (erf) GELU, as the checkpoints were trained with
        self.fc2 = fc2

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[n_patches, vision_dim], each block's patches consecutive -> [n_patches // merge_size**2, out_dim]."""
        blocks = self.norm(patches).reshape(-1, self.merge_size**2 * patches.shape[-1])
        return self.fc2(self.activation(self.fc1(blocks)))


class QwenVisionTransformer(nn.Module):
    """Patch embedding, 2-D RoPE, windowed and full-attention layers, and the patch merger (Qwen2.5-VL).

    Args:
        patch_size (int): side of a patch in pixels (14).
        temporal_patch_size (int): frames per patch (2).
        in_channels (int): image channels (3).
        embed_dim (int): vision width (1280).
        layers (nn.ModuleList | list[nn.Module]): the encoder layers, called as ``layer(x, mask=..., input_pos=...)``
            with x [1, n_patches, embed_dim], a [1, n_patches, n_patches] bool mask and (row, column) positions
            [1, n_patches, 2].
        merger (QwenPatchMerger): the patch merger, the fusion between the encoder and the language model.
        full_attention_layers (Sequence[int]): indices of the layers that attend over whole images (the config's
            ``fullatt_block_indexes``); the others attend within windows.
        window_size (int): side of an attention window in pixels; a multiple of ``patch_size * merge_size``.
        merge_size (int): side of a merge block in patches (the config's ``spatial_merge_size``). Default 2.

    Raises:
        ValueError: for a window that is not a whole number of merge blocks, or a layer index out of range.
    """

    def __init__(
        self,
        *,
        patch_size: int,
        temporal_patch_size: int,
        in_channels: int,
        embed_dim: int,
        layers: nn.ModuleList | list[nn.Module],
        merger: QwenPatchMerger,
        full_attention_layers: Sequence[int],
        window_size: int,
        merge_size: int = 2,
    ) -> None:
        super().__init__()
        block_pixels = patch_size * merge_size
        if window_size < block_pixels or window_size % block_pixels:
            raise ValueError(
                f"window_size ({window_size} pixels) must be a positive multiple of patch_size * spatial_merge_size "
                f"({block_pixels})."
            )
        self.layers = layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(layers)
        if any(not 0 <= i < len(self.layers) for i in full_attention_layers):
            raise ValueError(
                f"full_attention_layers {list(full_attention_layers)} must index the {len(self.layers)} layers."
            )
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.in_channels = in_channels
        self.embed_dim = embed_dim
        self.merge_size = merge_size
        self.window_size = window_size
        self.full_attention_layers = tuple(full_attention_layers)
        # stride = kernel: one linear map per patch (computed as a matrix product, see forward)
        kernel = (temporal_patch_size, patch_size, patch_size)
        self.patch_embed = nn.Conv3d(in_channels, embed_dim, kernel_size=kernel, stride=kernel, bias=False)
        self.merger = merger

    @property
    def patch_dim(self) -> int:
        """Features of one flattened patch in ``pixel_values``: channels * frames * patch_size ** 2."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Encodes the images of a batch.

        Args:
            pixel_values (torch.Tensor): [n_patches, channels * temporal_patch_size * patch_size ** 2], the patches
                of all images, image after image, as the processor lays them out.
            grid_thw (torch.Tensor): [n_images, 3] int64 frames, rows and columns of patches of each image.

        Returns:
            torch.Tensor: [n_patches // merge_size ** 2, out_dim], one vector per merge block, in the order of
            ``pixel_values``.

        Raises:
            ValueError: if the patches do not match the grids.
        """
        grids = _check_grids(pixel_values, grid_thw, self.patch_dim, self.merge_size)
        order, window_ids, image_ids, positions = _window_layout(
            grids, self.merge_size, self.window_size // (self.patch_size * self.merge_size), pixel_values.device
        )
        unit = self.merge_size**2
        # the Conv3d's weight as a [embed_dim, patch_dim] matrix: the same map, without a convolution's overhead
        weight = self.patch_embed.weight.reshape(self.embed_dim, -1)
        h = F.linear(pixel_values.to(weight.dtype), weight)  # [n_patches, embed_dim]
        # merge blocks window by window (a block's patches stay together)
        h = h.reshape(-1, unit, self.embed_dim)[order].reshape(1, -1, self.embed_dim)
        positions = positions.reshape(-1, unit, 2)[order].reshape(1, -1, 2)
        window_ids = window_ids.repeat_interleave(unit)
        image_ids = image_ids.repeat_interleave(unit)
        window_mask = (window_ids[:, None] == window_ids[None, :])[None]  # [1, n, n] block-diagonal
        image_mask = (image_ids[:, None] == image_ids[None, :])[None]
        for i, layer in enumerate(self.layers):
            mask = image_mask if i in self.full_attention_layers else window_mask
            h = layer(h, mask=mask, input_pos=positions)
        merged = self.merger(h[0])  # [n_blocks, out_dim], window order
        return merged[torch.argsort(order)]  # the processor's order again


def _check_grids(pixel_values: torch.Tensor, grid_thw: torch.Tensor, patch_dim: int, merge_size: int) -> list:
    """The grids as Python lists, after checking them against ``pixel_values``."""
    if pixel_values.dim() != 2 or pixel_values.shape[1] != patch_dim:
        raise ValueError(
            f"pixel_values must be [n_patches, {patch_dim}] (flattened patches, as the Qwen2.5-VL image processor "
            f"returns them), got shape {tuple(pixel_values.shape)}."
        )
    if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
        raise ValueError(f"image_grid_thw must be [n_images, 3], got shape {tuple(grid_thw.shape)}.")
    grids = grid_thw.tolist()
    if any(h % merge_size or w % merge_size for _, h, w in grids):
        raise ValueError(f"Every image's patch rows and columns must be multiples of {merge_size}, got {grids}.")
    total = sum(t * h * w for t, h, w in grids)
    if total != pixel_values.shape[0]:
        raise ValueError(
            f"image_grid_thw {grids} describes {total} patches, but pixel_values has {pixel_values.shape[0]}."
        )
    return grids


def _window_layout(
    grids: list, merge_size: int, window_blocks: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """How the merge blocks of the images are laid out for attention.

    Returns:
        order [n_blocks]: the blocks window by window (windows row by row, frame by frame, image by image; blocks
        row by row within a window), as indices into the processor's order; window and frame (full attention)
        number of each block in that new order [n_blocks]; and each patch's (row, column) in the processor's
        order [n_patches, 2].
    """
    orders, windows, frames, positions = [], [], [], []
    num_blocks = num_windows = num_frames = 0
    for t, h, w in grids:
        rows, cols = h // merge_size, w // merge_size
        frame, row, col = torch.meshgrid(
            torch.arange(t, device=device),
            torch.arange(rows, device=device),
            torch.arange(cols, device=device),
            indexing="ij",
        )  # [t, rows, cols] each: every merge block, in the processor's (row-major) order
        windows_down, windows_across = -(-rows // window_blocks), -(-cols // window_blocks)
        window = ((frame * windows_down + row // window_blocks) * windows_across + col // window_blocks).flatten()
        order = torch.argsort(window, stable=True)  # row-major within a window, as the stable sort keeps it
        orders.append(order + num_blocks)
        windows.append(window[order] + num_windows)
        frames.append(frame.flatten()[order] + num_frames)
        # each patch's row and column: blocks row-major, the merge_size x merge_size patches of a block row-major
        inner = torch.arange(merge_size, device=device)
        patch_row = (row[..., None, None] * merge_size + inner[:, None]).expand(t, rows, cols, merge_size, merge_size)
        patch_col = (col[..., None, None] * merge_size + inner[None, :]).expand(t, rows, cols, merge_size, merge_size)
        positions.append(torch.stack((patch_row, patch_col), dim=-1).reshape(-1, 2))
        num_blocks += t * rows * cols
        num_windows += t * windows_down * windows_across
        num_frames += t
    return torch.cat(orders), torch.cat(windows), torch.cat(frames), torch.cat(positions)
