"""MultiHeadAttention against a from-scratch reference (explicit scores, mask, softmax) in every mode."""

import pytest
import torch
from torch import nn

from tune.modules import MultiHeadAttention, RMSNorm, RotaryPositionalEmbeddings, get_causal_mask_from_padding_mask

EMBED, HEADS, KV_HEADS, HEAD_DIM = 24, 6, 2, 6


def _attention(**kwargs) -> MultiHeadAttention:
    torch.manual_seed(0)
    attn = MultiHeadAttention(
        embed_dim=EMBED,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        q_proj=nn.Linear(EMBED, HEADS * HEAD_DIM, bias=True),
        k_proj=nn.Linear(EMBED, KV_HEADS * HEAD_DIM, bias=True),
        v_proj=nn.Linear(EMBED, KV_HEADS * HEAD_DIM),
        output_proj=nn.Linear(HEADS * HEAD_DIM, EMBED, bias=False),
        pos_embeddings=RotaryPositionalEmbeddings(HEAD_DIM, max_seq_len=32),
        max_seq_len=32,
        **kwargs,
    )
    return attn.eval()


def _reference(attn: MultiHeadAttention, x, allowed, positions=None):
    """Plain attention: allowed [b, s, s] bool; float64 so it is the more exact side of the comparison."""
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, HEADS, HEAD_DIM)
    k = attn.k_proj(x).view(b, s, KV_HEADS, HEAD_DIM)
    v = attn.v_proj(x).view(b, s, KV_HEADS, HEAD_DIM)
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.pos_embeddings(q, input_pos=positions), attn.pos_embeddings(k, input_pos=positions)
    q, k, v = (t.transpose(1, 2).double() for t in (q, k, v))
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = q @ k.transpose(-1, -2) * attn.scale
    if attn.softcapping is not None:
        scores = torch.tanh(scores / attn.softcapping) * attn.softcapping
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HEADS * HEAD_DIM)
    return attn.output_proj(out.float())


def _band(seq_len, window):
    i = torch.arange(seq_len)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)


X = torch.randn(2, 9, EMBED, generator=torch.Generator().manual_seed(3))


def test_causal_gqa_fast_path_matches_reference():
    attn = _attention()
    with torch.no_grad():
        expected = _reference(attn, X, _band(9, 10**6)[None].expand(2, 9, 9))
        assert torch.allclose(attn(X), expected, atol=1e-5)


def test_padding_mask_and_positions_match_reference():
    attn = _attention(q_norm=RMSNorm(HEAD_DIM), k_norm=RMSNorm(HEAD_DIM))
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, :4] = False
    mask = get_causal_mask_from_padding_mask(padding)
    positions = ((padding.cumsum(-1) - 1) * padding).clamp(min=0)
    with torch.no_grad():
        out = attn(X, mask=mask, input_pos=positions)
        expected = _reference(attn, X, mask, positions)
    assert torch.allclose(out[padding], expected[padding], atol=1e-5)


def _packed(lengths_per_row):
    """Block-causal mask and per-document positions of packed rows, e.g. [[16, 16], [20, 12]]."""
    docs = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths_per_row])
    seq_len = docs.shape[1]
    mask = (docs[:, :, None] == docs[:, None, :]) & torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    positions = torch.stack([torch.cat([torch.arange(n) for n in r]) for r in lengths_per_row])
    return mask, positions


def test_packed_mask_attention_runs_document_by_document_and_matches_reference(monkeypatch):
    from tune.modules import _attention as attention_module

    # documents of 16+ tokens on average: the CPU path attends each document with is_causal (no dense mask)
    mask, positions = _packed([[16, 12, 4], [32]])
    assert attention_module._document_spans(mask) == [16, 12, 4, 32]
    attn = _attention()
    x = torch.randn(2, 32, EMBED, generator=torch.Generator().manual_seed(5), requires_grad=True)
    out = attn(x, mask=mask, input_pos=positions)
    with torch.no_grad():
        expected = _reference(attn, x, mask, positions)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # gradients equal those of the dense-mask path (the split is turned off by asking for impossibly long documents)
    grads = torch.autograd.grad(out.square().sum(), [x, attn.q_proj.weight])
    monkeypatch.setattr(attention_module, "_MIN_MEAN_DOCUMENT_LEN", 10**9)
    monkeypatch.setattr(attention_module, "_spans_cache", None)
    assert attention_module._document_spans(mask) is None
    dense = attn(x, mask=mask, input_pos=positions)
    for got, want in zip(grads, torch.autograd.grad(dense.square().sum(), [x, attn.q_proj.weight])):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_document_spans_only_for_block_causal_masks():
    from tune.modules import _attention as attention_module

    mask, _ = _packed([[20, 12], [32]])
    assert attention_module._document_spans(mask) == [20, 12, 32]
    not_causal = mask.clone()
    not_causal[0, 3, 5] = True  # a query that sees a later key
    assert attention_module._document_spans(not_causal) is None
    holes = mask.clone()
    holes[1, 9, 4] = False  # a query that skips a key of its own document
    assert attention_module._document_spans(holes) is None
    # padding queries that attend only themselves are one-token documents: too many calls, so the dense path
    padding = torch.ones(2, 32, dtype=torch.bool)
    padding[0, 8:] = False
    assert attention_module._document_spans(get_causal_mask_from_padding_mask(padding)) is None


@pytest.mark.parametrize("softcapping", [None, 1.5])
def test_sliding_window_and_softcapping_match_reference(softcapping):
    attn = _attention(sliding_window=3, softcapping=softcapping)
    with torch.no_grad():
        out = attn(X)
        expected = _reference(attn, X, _band(9, 3)[None].expand(2, 9, 9))
        unwindowed = _reference(attn, X, _band(9, 10**6)[None].expand(2, 9, 9))
    assert torch.allclose(out, expected, atol=1e-5)
    assert not torch.allclose(out, unwindowed, atol=1e-3)  # the window changed the result


def test_non_causal_attends_everything():
    attn = _attention(is_causal=False)
    with torch.no_grad():
        assert torch.allclose(attn(X), _reference(attn, X, torch.ones(2, 9, 9, dtype=torch.bool)), atol=1e-5)


@pytest.mark.parametrize("window, softcapping", [(None, None), (3, None), (4, 2.0)])
def test_kv_cache_decoding_matches_full_forward(window, softcapping):
    attn = _attention(sliding_window=window, softcapping=softcapping)
    with torch.no_grad():
        full = attn(X)
        attn.setup_cache(batch_size=2, dtype=torch.float32, max_seq_len=12)
        steps = [attn(X[:, :5])] + [attn(X[:, i : i + 1]) for i in range(5, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    attn.reset_cache()
    assert attn.kv_cache.size == 0


def test_kv_cache_with_padding_mask_over_cache_capacity():
    # left-padded generation: masks are [b, s, capacity] as a generation loop builds them
    attn = _attention()
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[0, :2] = False
    full_mask = get_causal_mask_from_padding_mask(padding, target_seq_len=12)
    positions = ((padding.cumsum(-1) - 1) * padding).clamp(min=0)
    with torch.no_grad():
        full = attn(X, mask=full_mask[:, :, :9], input_pos=positions)
        attn.setup_cache(batch_size=2, dtype=torch.float32, max_seq_len=12)
        prefill = attn(X[:, :6], mask=full_mask[:, :6], input_pos=positions[:, :6])
        rest = [
            attn(X[:, i : i + 1], mask=full_mask[:, i : i + 1], input_pos=positions[:, i : i + 1]) for i in (6, 7, 8)
        ]
    out = torch.cat([prefill, *rest], dim=1)
    assert torch.allclose(out[padding], full[padding], atol=1e-5)


def test_invalid_arguments_are_reported():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        MultiHeadAttention(
            embed_dim=8,
            num_heads=3,
            num_kv_heads=2,
            head_dim=4,
            q_proj=nn.Identity(),
            k_proj=nn.Identity(),
            v_proj=nn.Identity(),
            output_proj=nn.Identity(),
        )
    attn = _attention()
    with pytest.raises(TypeError, match="bool"):
        attn(X, mask=torch.ones(2, 9, 9))
    with pytest.raises(ValueError, match="seq=9"):
        attn(X, mask=torch.ones(2, 4, 9, dtype=torch.bool))
