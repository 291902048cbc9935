import pytest
import torch

from tune.modules import KVCache


def test_update_returns_filled_prefix_and_reset_empties():
    cache = KVCache(batch_size=2, max_seq_len=6, num_kv_heads=3, head_dim=4, dtype=torch.float32)
    k1, v1 = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    k, v = cache.update(k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1) and cache.size == 4
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    k, v = cache.update(k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    cache.reset()
    assert cache.size == 0 and not cache.k_cache.any()


def test_overflow_and_batch_mismatch_are_reported():
    cache = KVCache(batch_size=1, max_seq_len=3, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="overflow"):
        cache.update(torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2))
    with pytest.raises(ValueError, match="batch size 1"):
        cache.update(torch.randn(2, 1, 1, 2), torch.randn(2, 1, 1, 2))
