"""Cross-attention (MultiHeadAttention's ``y``, TransformerCrossAttentionLayer) and the fusion pieces
(FusionEmbedding, FusionLayer's fusion parameters). Llama 3.2 Vision's parity with transformers is in
tests/tune/models/test_llama3_2_vision.py."""

import pytest
import torch
from torch import nn

from tune.modules import FeedForward, MultiHeadAttention, RMSNorm, TanhGate, TransformerCrossAttentionLayer
from tune.modules.model_fusion import FusionEmbedding, FusionLayer, get_fusion_params, register_fusion_module


def _attention(is_causal: bool = False) -> MultiHeadAttention:
    dim = 8
    return MultiHeadAttention(
        embed_dim=dim, num_heads=2, num_kv_heads=1, head_dim=4, q_proj=nn.Linear(dim, 8), k_proj=nn.Linear(dim, 4),
        v_proj=nn.Linear(dim, 4), output_proj=nn.Linear(8, dim), is_causal=is_causal,
    )  # fmt: skip


def test_cross_attention_equals_softmax_over_the_other_sequence():
    torch.manual_seed(0)
    attn = _attention()
    x, y = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    mask = torch.rand(2, 3, 5) > 0.3
    mask[..., 0] = True
    q = attn.q_proj(x).view(2, 3, 2, 4).transpose(1, 2)
    k = attn.k_proj(y).view(2, 5, 1, 4).transpose(1, 2)
    v = attn.v_proj(y).view(2, 5, 1, 4).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask[:, None], float("-inf"))
    expected = attn.output_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 3, 8))
    assert torch.allclose(attn(x, y, mask=mask), expected, atol=1e-6)
    with pytest.raises(ValueError, match="is_causal=False"):
        _attention(is_causal=True)(x, y)


def test_cross_attention_layer_leaves_rows_without_encoder_tokens_unchanged():
    torch.manual_seed(1)
    dim = 8
    mlp = FeedForward(gate_proj=nn.Linear(dim, 16), down_proj=nn.Linear(16, dim), up_proj=nn.Linear(dim, 16))
    layer = TransformerCrossAttentionLayer(
        _attention(), mlp, ca_norm=RMSNorm(dim), mlp_norm=RMSNorm(dim), ca_scale=TanhGate(), mlp_scale=TanhGate()
    )
    with torch.no_grad():
        layer.ca_scale.scale.fill_(0.5)
        layer.mlp_scale.scale.fill_(-0.7)
    x, y = torch.randn(1, 4, dim), torch.randn(1, 6, dim)
    mask = torch.zeros(1, 4, 6, dtype=torch.bool)
    mask[0, 2:, :3] = True  # tokens 0 and 1 precede the image
    out = layer(x, encoder_input=y, encoder_mask=mask)
    assert torch.equal(out[:, :2], x[:, :2]) and not torch.allclose(out[:, 2:], x[:, 2:])
    assert torch.isfinite(out).all()
    assert torch.equal(layer(x, encoder_input=None), x)  # text-only: skipped
    with pytest.raises(ValueError, match="encoder_mask must be a bool tensor"):
        layer(x, encoder_input=y, encoder_mask=mask.float())


def test_fusion_embedding_and_fusion_params():
    torch.manual_seed(2)
    embedding = FusionEmbedding(vocab_size=10, fusion_vocab_size=3, embed_dim=4)
    tokens = torch.tensor([[0, 9, 10, 12]])
    out = embedding(tokens)
    assert torch.equal(out[0, :2], embedding.embedding.weight[[0, 9]])
    assert torch.equal(out[0, 2:], embedding.fusion_embedding.weight[[0, 2]])
    head = nn.Linear(4, 4)
    register_fusion_module(head)
    layer = FusionLayer(nn.Linear(4, 4), nn.Linear(4, 4))
    model = nn.ModuleDict({"embed": embedding, "head": head, "layer": layer})
    assert set(get_fusion_params(model)) == {
        "embed.fusion_embedding.weight", "head.weight", "head.bias", "layer.fusion_layer.weight",
        "layer.fusion_layer.bias",
    }  # fmt: skip
