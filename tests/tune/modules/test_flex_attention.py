"""Packed batches through flex attention (tune/modules/_flex_attention.py) against the dense masked SDPA call.

The decoder takes this route on CUDA only; flex attention runs its forward on the CPU too (not its backward), so
the forward is compared here with the device gate opened, and the backward in the GPU tier
(tests/gpu/test_gpu_kernels.py).
"""

import copy

import pytest
import torch

from tune.models.llama3_1 import llama3_1
from tune.models.mistral import mistral
from tune.modules import _transformer
from tune.modules._flex_attention import BlockMask, block_mask, flex_attend


def _block_causal(lengths_per_row: list[list[int]]) -> torch.Tensor:
    docs = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths_per_row])
    seq_len = docs.shape[1]
    return (docs[:, :, None] == docs[:, None, :]) & torch.ones(seq_len, seq_len, dtype=torch.bool).tril()


LENGTHS = [[100, 130, 26], [256]]  # documents crossing the 128-token tiles, and a row of one document


def test_flex_attend_equals_masked_sdpa():
    mask = _block_causal(LENGTHS)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 256, 32, generator=generator)
    k, v = (torch.randn(2, 2, 256, 32, generator=generator) for _ in range(2))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None], scale=0.25, enable_gqa=True
    )
    actual = flex_attend(q, k, v, block_mask(mask), scale=0.25, enable_gqa=True)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def _tiny(builder=llama3_1, **kwargs):
    torch.manual_seed(0)
    sizes = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=256)
    return builder(**sizes, intermediate_dim=128, **kwargs).eval()


def test_decoder_passes_one_block_mask_and_matches_dense_sdpa(monkeypatch):
    monkeypatch.setattr(_transformer, "flex_attention_supported", lambda device: True)  # the gate: CUDA only
    flex = _tiny()
    dense = copy.deepcopy(flex)
    dense.use_flex_attention = False
    seen = []
    flex.layers[1].attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["mask"]), with_kwargs=True
    )
    tokens = torch.randint(0, 64, (2, 256), generator=torch.Generator().manual_seed(1))
    mask = _block_causal(LENGTHS)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in LENGTHS])
    with torch.no_grad():
        expected = dense(tokens, mask=mask, input_pos=positions)
        actual = flex(tokens, mask=mask, input_pos=positions)
    assert isinstance(seen[0], BlockMask)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model, reason",
    [
        (lambda: _tiny(mistral, sliding_window=32), "sliding window"),
        (lambda: _tiny(attn_dropout=0.1).train(), "attention dropout while training"),
    ],
)
def test_decoder_keeps_the_dense_mask_where_attention_adds_to_it(monkeypatch, model, reason):
    monkeypatch.setattr(_transformer, "flex_attention_supported", lambda device: True)
    assert not model()._flex_mask_applies(_block_causal(LENGTHS)), reason


def test_decoder_uses_flex_attention_on_cuda_only():
    mask = _block_causal(LENGTHS)
    assert not _tiny()._flex_mask_applies(mask)  # on the CPU the per-document route (_packed_attention) applies
