"""LongRoPE: RoPE with per-frequency rescaling for a short and a long context (Ding et al., 2024,
https://arxiv.org/abs/2402.13753), as used by Phi-3's 128k-context models (``rope_type: longrope`` in Hugging
Face configs).
"""

import math
from collections.abc import Sequence

import torch

from tune.modules._position_embeddings import RotaryPositionalEmbeddings


class LongRoPE(RotaryPositionalEmbeddings):
    """Rotary embeddings whose frequencies are divided by one factor per rotated pair, with two factor sets.

    Pair ``i`` rotates at ``1 / (factor[i] * base ** (2i / dim))``. ``short_factor`` is used while the sequence
    fits the pre-training context ``original_max_seq_len``; ``long_factor`` once it is longer. The sequence length
    is the largest position in the call plus one, over the whole batch: a batch (or packed row) with any position
    at or past ``original_max_seq_len`` uses the long factors at every position, and so does each decoding step
    past it, while keys already in a KV cache keep the factors they were rotated with. This is the rule of
    Hugging Face ``transformers`` (``longrope`` in ``modeling_rope_utils``), so logits match it in both regimes.
    Both cosine tables are precomputed and the regime is picked on the device, without a host synchronisation.

    Cosine and sine are multiplied by ``attention_factor`` (both regimes), which scales the attention logits by
    its square; by default ``sqrt(1 + ln(s) / ln(original_max_seq_len))`` with ``s = scale_factor``, or 1 when
    ``s <= 1`` (the LongRoPE/YaRN attention temperature, https://arxiv.org/abs/2309.00071).

    Args:
        dim (int): rotated features per head (the head dimension).
        max_seq_len (int): the largest position + 1 that will be looked up.
        base (float): the RoPE theta.
        short_factor (Sequence[float]): ``dim // 2`` divisors of the frequencies for short sequences.
        long_factor (Sequence[float]): ``dim // 2`` divisors for sequences longer than ``original_max_seq_len``.
        original_max_seq_len (int): the pre-training context length.
        scale_factor (float | None): the context extension ratio the default ``attention_factor`` is computed
            from (Hugging Face's ``factor``). Default None: ``max_seq_len / original_max_seq_len``.
        attention_factor (float | None): the multiplier of cosine and sine. Default None: computed as above.

    Raises:
        ValueError: for factor lists that do not have ``dim // 2`` entries, or a non-positive
            ``original_max_seq_len``.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int,
        base: float,
        short_factor: Sequence[float],
        long_factor: Sequence[float],
        original_max_seq_len: int,
        scale_factor: float | None = None,
        attention_factor: float | None = None,
    ) -> None:
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(factors) != dim // 2:
                raise ValueError(
                    f"LongRoPE {name} has {len(factors)} entries; it needs one per rotated pair, dim // 2 = {dim // 2}."
                )
        if original_max_seq_len < 1:
            raise ValueError(f"original_max_seq_len must be positive, got {original_max_seq_len}.")
        self.short_factor = tuple(float(f) for f in short_factor)
        self.long_factor = tuple(float(f) for f in long_factor)
        self.original_max_seq_len = int(original_max_seq_len)
        if scale_factor is None:
            scale_factor = max_seq_len / original_max_seq_len
        self.scale_factor = float(scale_factor)
        if attention_factor is None:
            attention_factor = 1.0
            if scale_factor > 1.0:
                attention_factor = math.sqrt(1 + math.log(scale_factor) / math.log(original_max_seq_len))
        self.attention_factor = float(attention_factor)
        super().__init__(dim, max_seq_len, base)
        # the long-context tables, beside the parent's (short-context) cos_cache/sin_cache
        self.register_buffer("long_cos_cache", torch.empty(max_seq_len, dim), persistent=False)
        self.register_buffer("long_sin_cache", torch.empty(max_seq_len, dim), persistent=False)
        self.reset_parameters()

    def _frequencies(self, factors: tuple[float, ...], device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.int64, device=device).float() / self.dim
        return 1.0 / (torch.tensor(factors, dtype=torch.float32, device=device) * self.base**exponents)

    def inverse_frequencies(self) -> torch.Tensor:
        """The short-context frequencies [dim // 2] in float32."""
        return self._frequencies(self.short_factor, self.cos_cache.device)

    def reset_parameters(self) -> None:
        """(Re)computes both regimes' cosine/sine tables (after building on the meta device and ``to_empty``)."""
        device = self.cos_cache.device
        if device.type == "meta" or "long_cos_cache" not in self._buffers:  # parent's __init__: tables come next
            return
        positions = torch.arange(self.max_seq_len, device=device, dtype=torch.int64).float()
        tables = ((self.short_factor, self.cos_cache, self.sin_cache),)
        tables += ((self.long_factor, self.long_cos_cache, self.long_sin_cache),)
        for factors, cos_cache, sin_cache in tables:
            angles = positions[:, None] * self._frequencies(factors, device)[None, :]  # [max_seq_len, dim // 2]
            angles = torch.cat((angles, angles), dim=-1)  # [max_seq_len, dim]
            with torch.no_grad():
                cos_cache.copy_(angles.cos() * self.attention_factor)
                sin_cache.copy_(angles.sin() * self.attention_factor)

    rope_init = reset_parameters

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Applies the rotation with the factors of the call's regime.

        Args:
            x (torch.Tensor): [b, s, num_heads, dim] queries or keys.
            input_pos (torch.Tensor | None): [b, s] int64 positions; None means ``0 .. s-1`` for every row.

        Returns:
            torch.Tensor: rotated ``x``, same shape and dtype.
        """
        seq_len = x.shape[1]
        if input_pos is None:
            long = seq_len > self.original_max_seq_len
            cos = (self.long_cos_cache if long else self.cos_cache)[:seq_len][None, :, None]
            sin = (self.long_sin_cache if long else self.sin_cache)[:seq_len][None, :, None]
        else:
            long = input_pos.max() + 1 > self.original_max_seq_len  # a 0-dim tensor: no host synchronisation
            cos = torch.where(long, self.long_cos_cache[input_pos], self.cos_cache[input_pos])[:, :, None]
            sin = torch.where(long, self.long_sin_cache[input_pos], self.sin_cache[input_pos])[:, :, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # [1 or b, s, 1, dim]
        half = self.dim // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # rotate_half as a roll, see the parent
        return x * cos + x.roll(half, dims=-1) * signed_sin

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, original_max_seq_len={self.original_max_seq_len}, "
            f"attention_factor={self.attention_factor:.6g}"
        )
