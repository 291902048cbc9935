"""Rotary position embeddings (RoPE; Su et al., 2021, https://arxiv.org/abs/2104.09864).

tune uses the "rotate half" layout of Hugging Face ``transformers``: the first half of each head's features is
rotated against the second half. Hugging Face checkpoints therefore load with a pure key rename (no permutation
of the q/k projection rows); only Meta's original checkpoints need one.
"""

import math

import torch
from torch import nn


class RotaryPositionalEmbeddings(nn.Module):
    """Rotates query/key features by angles proportional to the token position.

    The cosine and sine tables for positions ``0 .. max_seq_len - 1`` are precomputed in float32 and cast to the
    input dtype at use, like Hugging Face does. Share one instance between all layers of a model: the tables are
    then stored once.

    Args:
        dim (int): rotated features per head (the head dimension).
        max_seq_len (int): the largest position + 1 that will be looked up. Default 4096.
        base (float): the RoPE theta. Default 10000.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got dim={dim}.")
        self.dim = dim
        self.max_seq_len = max_seq_len
        self.base = base
        self.register_buffer("cos_cache", torch.empty(max_seq_len, dim), persistent=False)
        self.register_buffer("sin_cache", torch.empty(max_seq_len, dim), persistent=False)
        self.reset_parameters()

    def inverse_frequencies(self) -> torch.Tensor:
        """The per-pair rotation frequencies [dim // 2] in float32 (overridden by scaled variants)."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64).float() / self.dim
        return 1.0 / (self.base**exponents)

    def reset_parameters(self) -> None:
        """(Re)computes the cosine/sine tables, e.g. after building on the meta device and ``to_empty``."""
        device = self.cos_cache.device
        if device.type == "meta":
            return
        inv_freq = self.inverse_frequencies().to(device)
        positions = torch.arange(self.max_seq_len, device=device, dtype=torch.int64).float()
        angles = positions[:, None] * inv_freq[None, :]  # [max_seq_len, dim // 2]
        angles = torch.cat((angles, angles), dim=-1)  # [max_seq_len, dim]
        with torch.no_grad():
            self.cos_cache.copy_(angles.cos())
            self.sin_cache.copy_(angles.sin())

    rope_init = reset_parameters  # torchtune's name for the same thing

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Applies the rotation.

        Args:
            x (torch.Tensor): [b, s, num_heads, dim] queries or keys.
            input_pos (torch.Tensor | None): [b, s] int64 positions; None means ``0 .. s-1`` for every row.

        Returns:
            torch.Tensor: rotated ``x``, same shape and dtype.
        """
        seq_len = x.shape[1]
        if input_pos is None:
            cos, sin = self.cos_cache[:seq_len][None, :, None], self.sin_cache[:seq_len][None, :, None]
        else:
            cos, sin = self.cos_cache[input_pos][:, :, None], self.sin_cache[input_pos][:, :, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # [1 or b, s, 1, dim]
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2], exactly (only signs move): the sign goes onto
        # the small table, and roll (a two-block copy whose backward is a roll) replaces slicing, negating and
        # concatenating x, and the zero-filled slice gradients of that in backward
        half = self.dim // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return x * cos + x.roll(half, dims=-1) * signed_sin

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_seq_len={self.max_seq_len}, base={self.base}"


class Llama3ScaledRoPE(RotaryPositionalEmbeddings):
    """RoPE with Llama 3.1's frequency scaling for long context.

    Frequencies whose wavelength is longer than ``old_context_len / low_freq_factor`` are divided by
    ``scale_factor``; those shorter than ``old_context_len / high_freq_factor`` are kept; the band between is
    interpolated smoothly (Meta's Llama 3.1 reference code; ``rope_type: llama3`` in Hugging Face configs).

    Args:
        dim (int): rotated features per head.
        max_seq_len (int): the largest position + 1. Default 131072.
        base (float): the RoPE theta. Default 500000.
        scale_factor (float): divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2). Default 8.
        low_freq_factor (float): Default 1.
        high_freq_factor (float): Default 4.
        old_context_len (int): the pre-training context the scaling extends. Default 8192.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 131_072,
        base: float = 500_000.0,
        scale_factor: float = 8.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        old_context_len: int = 8192,
    ) -> None:
        if high_freq_factor < low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({high_freq_factor}) must not be smaller than low_freq_factor ({low_freq_factor})."
            )
        self.scale_factor = scale_factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.old_context_len = old_context_len
        super().__init__(dim, max_seq_len, base)

    def inverse_frequencies(self) -> torch.Tensor:
        inv_freq = super().inverse_frequencies()
        wavelen = 2 * math.pi / inv_freq
        low_freq_wavelen = self.old_context_len / self.low_freq_factor
        high_freq_wavelen = self.old_context_len / self.high_freq_factor
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.scale_factor, inv_freq)
        # equal factors (Llama 4 Scout: 1 and 1) leave no band to interpolate: is_medium is then False throughout
        band = max(self.high_freq_factor - self.low_freq_factor, 1e-12)
        smooth = (self.old_context_len / wavelen - self.low_freq_factor) / band
        smoothed = (1 - smooth) * scaled / self.scale_factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_factor={self.scale_factor}, old_context_len={self.old_context_len}"


class LinearScaledRoPE(RotaryPositionalEmbeddings):
    """RoPE with linear position interpolation: every frequency is divided by ``scale_factor``, so position ``p``
    is rotated as position ``p / scale_factor`` would be unscaled (Chen et al., 2023,
    https://arxiv.org/abs/2306.15595; ``rope_type: linear`` in Hugging Face configs, used by Gemma 3's global
    layers).

    Args:
        dim (int): rotated features per head.
        max_seq_len (int): the largest position + 1. Default 4096.
        base (float): the RoPE theta. Default 10000.
        scale_factor (float): divisor of every frequency; 1 is plain RoPE. Default 1.

    Raises:
        ValueError: if ``scale_factor`` is not positive.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000.0, scale_factor: float = 1.0) -> None:
        if scale_factor <= 0:
            raise ValueError(f"scale_factor must be positive, got {scale_factor}.")
        self.scale_factor = scale_factor
        super().__init__(dim, max_seq_len, base)

    def inverse_frequencies(self) -> torch.Tensor:
        return super().inverse_frequencies() / self.scale_factor

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_factor={self.scale_factor}"
