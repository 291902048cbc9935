"""The attention of a context-parallel rank, in one process: its two chunks' queries over the whole sequence.

``_CausalChunkAttention`` merges blocks through their log-sum-exps and computes gradients block by block; here
it is compared with plain causal SDPA over the whole sequence (the rows of the rank's chunks), forward and
backward, for every rank of 2 and 3-rank layouts, with grouped-query heads. The distributed path (gathering the
keys and values over gloo ranks, whole models) is tested in tests/tune/training/test_context_parallel.py.
"""

import pytest
import torch
import torch.nn.functional as F

from tune.modules._context_parallel import _CausalChunkAttention, causal_blocks, load_balanced_chunks


def _local_index(rank: int, size: int, chunk_len: int) -> torch.Tensor:
    return torch.cat([torch.arange(c * chunk_len, (c + 1) * chunk_len) for c in load_balanced_chunks(rank, size)])


def _gathered(x: torch.Tensor, size: int, chunk_len: int) -> torch.Tensor:
    """[b, h, S, d] -> [size, b, h, 2C, d]: what an all-gather of every rank's two chunks holds."""
    return torch.stack([x[:, :, _local_index(rank, size, chunk_len)] for rank in range(size)])


def check_rank_attention(device: str, dtype: torch.dtype, atol: float) -> float:
    """Runs the comparison on ``device``; returns the largest difference seen (values and gradients)."""
    gen = torch.Generator().manual_seed(0)
    batch_size, num_heads, num_kv_heads, head_dim, chunk_len = 2, 4, 2, 16, 5
    worst = 0.0
    for size in (2, 3):
        seq_len = 2 * size * chunk_len
        q = torch.randn(batch_size, num_heads, seq_len, head_dim, generator=gen)
        k = torch.randn(batch_size, num_kv_heads, seq_len, head_dim, generator=gen)
        v = torch.randn(batch_size, num_kv_heads, seq_len, head_dim, generator=gen)
        grad_out = torch.randn(batch_size, num_heads, seq_len, head_dim, generator=gen)
        for rank in range(size):
            index = _local_index(rank, size, chunk_len)
            leaves = [t.to(device, dtype, copy=True).requires_grad_() for t in (q, k, v)]
            ref_leaves = [t.to(device, torch.float32, copy=True).requires_grad_() for t in (q, k, v)]
            ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=True, scale=0.3, enable_gqa=True)
            ref = ref[:, :, index]
            ref.backward(grad_out[:, :, index].to(device))
            local_q = leaves[0][:, :, index]
            k_all, v_all = (_gathered(leaf, size, chunk_len) for leaf in leaves[1:])
            out = _CausalChunkAttention.apply(local_q, k_all, v_all, causal_blocks(rank, size), 0.3)
            out.backward(grad_out[:, :, index].to(device, dtype))
            pairs = [(out, ref)] + [(leaf.grad, ref_leaf.grad) for leaf, ref_leaf in zip(leaves, ref_leaves)]
            for got, want in pairs:
                difference = (got.float() - want).abs().max().item()
                worst = max(worst, difference)
                assert difference < atol, (size, rank, difference)
    return worst


def test_a_rank_attends_its_chunks_like_causal_attention_over_the_whole_sequence():
    worst = check_rank_attention("cpu", torch.float32, atol=1e-5)
    print(f"max |chunked - causal SDPA| over outputs and q/k/v gradients: {worst:.1e}")
    assert worst < 1e-5


def test_blocks_cover_every_earlier_chunk_once_and_only_the_own_chunk_causally():
    for size in (1, 2, 4):
        holds = {(r, half): chunk for r in range(size) for half, chunk in enumerate(load_balanced_chunks(r, size))}
        for rank in range(size):
            for chunk, blocks in zip(load_balanced_chunks(rank, size), causal_blocks(rank, size)):
                assert [holds[(r, half)] for r, half, _ in blocks] == list(range(chunk + 1))
                assert [causal for *_, causal in blocks] == [False] * chunk + [True]


@pytest.mark.parametrize("rank,size,expected", [(0, 2, (0, 3)), (1, 2, (1, 2)), (3, 4, (3, 4))])
def test_each_rank_holds_an_early_chunk_and_its_mirror(rank, size, expected):
    assert load_balanced_chunks(rank, size) == expected
