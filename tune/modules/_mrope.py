"""Multimodal rotary position embeddings (M-RoPE; Qwen2-VL, Wang et al., 2024, https://arxiv.org/abs/2409.12191).

Each token has three positions: temporal, height and width. Text tokens carry the same number in all three (so on
text M-RoPE is plain RoPE); an image token carries its row and column in the image's grid. The rotated frequency
pairs of a head are split into sections (``mrope_section``, ``[16, 24, 24]`` in the Qwen2.5-VL releases): the
first section turns with the temporal position, the second with the height, the third with the width.
"""

from collections.abc import Sequence

import torch
from torch import nn


class MultimodalRotaryEmbeddings(nn.Module):
    """RoPE over three position axes, each driving its own section of the frequencies ("rotate half" layout).

    Positions go in as ``input_pos`` of shape [3, b, s] (temporal, height, width); a [b, s] tensor (or None for
    ``0..s-1``) gives every axis the same positions, which is plain RoPE. The angles are computed from the
    positions at each call (float32 ``position * frequency``, as transformers computes them), so there is no table
    to size and positions may exceed ``max_seq_len``.

    Args:
        dim (int): rotated features per head (the head dimension).
        mrope_section (Sequence[int]): frequency pairs per axis; they sum to ``dim // 2``. Sections after the third
            cycle through the axes again (temporal, height, width, temporal, ...), as transformers does.
        max_seq_len (int): recorded for tools that read it (the model's context). Default 4096.
        base (float): the RoPE theta. Default 10000.

    Raises:
        ValueError: if ``dim`` is odd or the sections do not sum to ``dim // 2``.
    """

    def __init__(self, dim: int, mrope_section: Sequence[int], max_seq_len: int = 4096, base: float = 10_000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got dim={dim}.")
        if sum(mrope_section) != dim // 2:
            raise ValueError(
                f"mrope_section {list(mrope_section)} sums to {sum(mrope_section)}, but a head of {dim} features "
                f"rotates {dim // 2} pairs; the sections must sum to head_dim // 2."
            )
        self.dim = dim
        self.mrope_section = tuple(mrope_section)
        self.max_seq_len = max_seq_len
        self.base = base
        # which position axis (0 temporal, 1 height, 2 width) drives each frequency pair
        axes = [i % 3 for i, size in enumerate(self.mrope_section) for _ in range(size)]
        self.register_buffer("freq_axis", torch.tensor(axes, dtype=torch.int64), persistent=False)
        self.register_buffer("inv_freq", torch.empty(dim // 2), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)computes the frequencies and axes, e.g. after building on the meta device and ``to_empty``."""
        device = self.inv_freq.device
        if device.type == "meta":
            return
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float() / self.dim
        axes = [i % 3 for i, size in enumerate(self.mrope_section) for _ in range(size)]
        with torch.no_grad():
            self.inv_freq.copy_(1.0 / (self.base**exponents))
            self.freq_axis.copy_(torch.tensor(axes, dtype=torch.int64, device=device))

    rope_init = reset_parameters  # torchtune's name for the same thing

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Applies the rotation.

        Args:
            x (torch.Tensor): [b, s, num_heads, dim] queries or keys.
            input_pos (torch.Tensor | None): [3, b, s] int64 (temporal, height, width) positions; or [b, s] (the
                same on every axis); None for ``0..s-1``.

        Returns:
            torch.Tensor: rotated ``x``, same shape and dtype.

        Raises:
            ValueError: for positions of another shape.
        """
        seq_len = x.shape[1]
        if input_pos is None:
            input_pos = torch.arange(seq_len, device=x.device)[None]
        if input_pos.dim() == 2:
            positions = input_pos[..., None].expand(*input_pos.shape, self.dim // 2)  # [b, s, dim // 2]
        elif input_pos.dim() == 3 and input_pos.shape[0] == 3:
            positions = input_pos.permute(1, 2, 0)[..., self.freq_axis]  # [b, s, dim // 2], each pair's axis
        else:
            raise ValueError(
                f"M-RoPE positions must be [3, batch, seq] or [batch, seq], got shape {tuple(input_pos.shape)}."
            )
        angles = positions.float() * self.inv_freq  # [b, s, dim // 2]
        angles = torch.cat((angles, angles), dim=-1)[:, :, None]  # [b, s, 1, dim]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        half = self.dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def extra_repr(self) -> str:
        return f"dim={self.dim}, mrope_section={list(self.mrope_section)}, base={self.base}"
