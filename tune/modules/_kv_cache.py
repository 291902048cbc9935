"""Key/value cache for incremental decoding."""

import torch
from torch import nn


class KVCache(nn.Module):
    """Stores the keys and values of past tokens of one attention layer.

    ``update`` appends the keys/values of the current step at position ``size`` and returns everything filled so
    far, so attention during generation only touches real entries.

    Args:
        batch_size (int): rows in the batch being generated.
        max_seq_len (int): capacity in tokens (prompt + generated).
        num_kv_heads (int): key/value heads of the layer.
        head_dim (int): features per head.
        dtype (torch.dtype): dtype of the stored keys and values.
        device (torch.device | str | None): where to allocate. Default: the current default device.
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.size = 0  # tokens filled so far (a Python int: positions are known on the host without a sync)

    def reset(self) -> None:
        """Empties the cache (the memory is kept and zeroed)."""
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.size = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends ``k`` and ``v`` [b, num_kv_heads, s, head_dim] and returns the filled cache.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: keys and values [b, num_kv_heads, size, head_dim], ``size``
            counting the new tokens.

        Raises:
            ValueError: if the batch size differs from the one the cache was set up with, or the cache would
                overflow.
        """
        batch_size, _, seq_len, _ = k.shape
        if batch_size != self.batch_size:
            raise ValueError(
                f"KV cache was set up for batch size {self.batch_size} but got {batch_size}; call "
                "model.setup_caches(batch_size=...) again with the batch size you generate with."
            )
        end = self.size + seq_len
        if end > self.max_seq_len:
            raise ValueError(
                f"KV cache overflow: it holds {self.max_seq_len} tokens, {self.size} are filled and {seq_len} more "
                "were given. Set up the caches with a larger decoder_max_seq_len or generate fewer tokens."
            )
        self.k_cache[:, :, self.size : end] = k
        self.v_cache[:, :, self.size : end] = v
        self.size = end
        return self.k_cache[:, :, :end], self.v_cache[:, :, :end]

    def extra_repr(self) -> str:
        return f"batch_size={self.batch_size}, max_seq_len={self.max_seq_len}, size={self.size}"
