"""KV-cache helpers: local_kv_cache sets caches up for a block, disable_kv_cache bypasses them, delete frees them."""

import pytest
import torch

from tune.models.llama3_2 import llama3_2
from tune.modules import delete_kv_caches, disable_kv_cache, local_kv_cache

TOKENS = torch.randint(0, 53, (2, 6), generator=torch.Generator().manual_seed(1))


def _model():
    torch.manual_seed(0)
    return llama3_2(
        vocab_size=53, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=24, intermediate_dim=40
    ).eval()


def test_local_kv_cache_sets_caches_up_inside_and_deletes_them_on_exit():
    model = _model()
    with torch.no_grad():
        full = model(TOKENS)
        with local_kv_cache(model, batch_size=2, device=torch.device("cpu"), dtype=torch.float32):
            assert model.caches_are_setup() and model.caches_are_enabled()
            prefix = model(TOKENS[:, :4])  # the prompt fills the cache, then one token at a time
            last = model(TOKENS[:, 4:5])
            with pytest.raises(ValueError, match="already has KV caches"):
                with local_kv_cache(model, batch_size=2, device=torch.device("cpu"), dtype=torch.float32):
                    pass
    assert not model.caches_are_setup()
    torch.testing.assert_close(prefix, full[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, full[:, 4:5], atol=1e-5, rtol=1e-5)


def test_disable_kv_cache_runs_full_forwards_and_leaves_the_cache_untouched():
    model = _model()
    model.setup_caches(batch_size=2, dtype=torch.float32)
    with torch.no_grad():
        model(TOKENS[:, :3])  # 3 tokens cached
        with disable_kv_cache(model):
            assert model.caches_are_setup() and not model.caches_are_enabled()
            full = model(TOKENS)  # attends only itself, positions from 0
        assert model.caches_are_enabled()
        assert all(layer.attn.kv_cache.size == 3 for layer in model.layers)
        delete_kv_caches(model)
        torch.testing.assert_close(full, model(TOKENS))
    assert not model.caches_are_setup()
    with pytest.raises(ValueError, match="no KV caches"):
        delete_kv_caches(model)
    with pytest.raises(ValueError, match="no KV caches"):
        with disable_kv_cache(model):
            pass
