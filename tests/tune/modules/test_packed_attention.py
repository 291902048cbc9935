"""Per-document attention for packed batches (tune/modules/_packed_attention.py) against one masked SDPA call."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.modules import MultiHeadAttention, RotaryPositionalEmbeddings, _attention, _packed_attention
from tune.modules._packed_attention import MaskSpans, attend_documents, document_spans, is_candidate_mask

EMBED, HEADS, KV_HEADS, HEAD_DIM = 24, 6, 2, 8


def _block_causal(lengths_per_row: list[list[int]]) -> torch.Tensor:
    """[b, s, s] bool: a token attends the tokens of its own document up to itself."""
    docs = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths_per_row])
    seq_len = docs.shape[1]
    return (docs[:, :, None] == docs[:, None, :]) & torch.ones(seq_len, seq_len, dtype=torch.bool).tril()


def _positions(lengths_per_row: list[list[int]]) -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths_per_row])


@pytest.fixture
def empty_spans_cache(monkeypatch):
    monkeypatch.setattr(_attention, "_spans_cache", None)


def test_attend_documents_equals_masked_sdpa_outputs_and_gradients():
    lengths = [[20, 7, 5], [32]]
    mask = _block_causal(lengths)
    generator = torch.Generator().manual_seed(0)
    # [b, heads, s, head_dim] transposed views of [b, s, heads, head_dim], as MultiHeadAttention passes them
    q, k, v = (
        torch.randn(2, 32, heads, HEAD_DIM, generator=generator).requires_grad_().transpose(1, 2)
        for heads in (HEADS, KV_HEADS, KV_HEADS)
    )
    got = attend_documents(q, k, v, [20, 7, 5, 32], scale=0.3, enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=0.3, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(want.shape, generator=generator)
    got_grads = torch.autograd.grad(got, (q, k, v), upstream)
    want_grads = torch.autograd.grad(want, (q, k, v), upstream)
    for got_grad, want_grad in zip(got_grads, want_grads):
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5)


def test_document_spans_reads_block_causal_masks_only():
    assert document_spans(_block_causal([[20, 12], [32]]), min_mean_document_len=16) == [20, 12, 32]
    assert document_spans(_block_causal([[20, 12], [32]]), min_mean_document_len=22) is None  # 3 docs over 64
    assert document_spans(torch.ones(1, 8, 8, dtype=torch.bool), min_mean_document_len=1) is None  # not causal
    causal = torch.ones(2, 8, 8, dtype=torch.bool).tril()
    assert document_spans(causal, min_mean_document_len=1) == [8, 8]


def test_is_candidate_mask_takes_square_bool_cpu_masks():
    q = torch.randn(2, HEADS, 9, HEAD_DIM)
    assert is_candidate_mask(torch.ones(2, 9, 9, dtype=torch.bool), q)
    assert not is_candidate_mask(None, q)
    assert not is_candidate_mask(torch.ones(2, 9, 9), q)  # float
    assert not is_candidate_mask(torch.ones(2, 9, 12, dtype=torch.bool), q)  # a mask over a KV cache
    assert not is_candidate_mask(torch.ones(2, 8, 8, dtype=torch.bool), q)  # malformed: the masked call reports it


def test_mask_spans_entry_answers_for_its_mask_only():
    mask = _block_causal([[16, 16]])
    entry = MaskSpans.find(mask, 16)
    assert entry.spans == [16, 16] and entry.matches(mask, 16)
    assert not entry.matches(mask.clone(), 16)  # equal contents, another tensor
    assert not entry.matches(mask, 8)  # another threshold
    mask[0, 20, 3] = True  # changed in place: the version counter moved
    assert not entry.matches(mask, 16)
    del mask
    gc.collect()
    assert entry.mask() is None  # the entry does not keep the batch alive


def _attention_layer() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(
        embed_dim=EMBED,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        q_proj=nn.Linear(EMBED, HEADS * HEAD_DIM, bias=True),
        k_proj=nn.Linear(EMBED, KV_HEADS * HEAD_DIM, bias=False),
        v_proj=nn.Linear(EMBED, KV_HEADS * HEAD_DIM, bias=False),
        output_proj=nn.Linear(HEADS * HEAD_DIM, EMBED, bias=False),
        pos_embeddings=RotaryPositionalEmbeddings(HEAD_DIM, max_seq_len=64),
        max_seq_len=64,
    )


def _count_calls(monkeypatch, module, name) -> list[int]:
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_forcing_the_masked_call_gives_the_same_outputs_and_gradients(monkeypatch, empty_spans_cache):
    lengths = [[20, 8, 4], [32]]  # 4 documents over 64 positions: the mean (16) qualifies
    mask, positions = _block_causal(lengths), _positions(lengths)
    attn = _attention_layer()
    per_document = _count_calls(monkeypatch, _attention, "attend_documents")
    x = torch.randn(2, 32, EMBED, generator=torch.Generator().manual_seed(1), requires_grad=True)
    results = []
    for split in (True, False):
        attn.split_packed_documents = split
        out = attn(x, mask=mask, input_pos=positions)
        grads = torch.autograd.grad(out.square().sum(), [x, attn.q_proj.weight, attn.q_proj.bias, attn.v_proj.weight])
        results.append([out, *grads])
    assert per_document == [1]  # the split ran once, and split_packed_documents=False skipped it
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_layers_given_the_same_mask_share_one_search(monkeypatch, empty_spans_cache):
    searches = _count_calls(monkeypatch, _packed_attention, "document_spans")
    lengths = [[16, 16], [32]]
    mask, positions = _block_causal(lengths), _positions(lengths)
    layers = [_attention_layer(), _attention_layer()]
    x = torch.randn(2, 32, EMBED)
    with torch.no_grad():
        for layer in layers:
            layer(x, mask=mask, input_pos=positions)
        assert searches == [1]
        layers[0](x, mask=mask.clone(), input_pos=positions)  # a new batch's mask
    assert searches == [1, 1]
