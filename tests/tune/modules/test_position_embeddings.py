import pytest
import torch

from tune.modules import Llama3ScaledRoPE, RotaryPositionalEmbeddings

transformers = pytest.importorskip("transformers")


def _hf_rotate(config, x_bshd, positions):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb on [b, heads, s, d] layout."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    rope = LlamaRotaryEmbedding(config)
    x = x_bshd.transpose(1, 2)
    cos, sin = rope(x, positions)
    rotated, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return rotated.transpose(1, 2)


def _config(**rope):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128, **rope)


def test_matches_transformers_default_rope_at_given_positions():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 5, 6, 7, 100]])
    rope = RotaryPositionalEmbeddings(16, max_seq_len=128, base=777.0)
    expected = _hf_rotate(_config(rope_theta=777.0), x, positions)
    assert torch.allclose(rope(x, input_pos=positions), expected, atol=1e-6, rtol=0)


def test_matches_transformers_llama3_scaled_rope():
    torch.manual_seed(0)
    x = torch.randn(1, 9, 2, 16)
    positions = torch.arange(9)[None] * 11
    scaling = dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32
    )
    rope = Llama3ScaledRoPE(16, max_seq_len=128, base=10_000.0, scale_factor=8.0, old_context_len=32)
    expected = _hf_rotate(_config(rope_theta=10_000.0, rope_scaling=scaling), x, positions)
    assert torch.allclose(rope(x, input_pos=positions), expected, atol=1e-6, rtol=0)
    # the scaling changed some frequencies but kept the highest one
    plain = RotaryPositionalEmbeddings(16, base=10_000.0).inverse_frequencies()
    scaled = rope.inverse_frequencies()
    assert scaled[0] == plain[0] and (scaled < plain).any()


def test_no_positions_means_0_to_s_minus_1():
    x = torch.randn(2, 5, 1, 8)
    rope = RotaryPositionalEmbeddings(8, max_seq_len=16)
    assert torch.equal(rope(x), rope(x, input_pos=torch.arange(5).expand(2, 5)))


def test_position_zero_is_identity_and_rotation_preserves_norm():
    x = torch.randn(1, 4, 2, 8)
    rope = RotaryPositionalEmbeddings(8, max_seq_len=16)
    out = rope(x)
    assert torch.allclose(out[:, 0], x[:, 0])
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_tables_rebuilt_after_meta_init():
    with torch.device("meta"):
        rope = RotaryPositionalEmbeddings(8, max_seq_len=16)
    rope.to_empty(device="cpu")
    rope.reset_parameters()
    assert torch.equal(rope.cos_cache, RotaryPositionalEmbeddings(8, max_seq_len=16).cos_cache)


def test_odd_dim_rejected():
    with pytest.raises(ValueError, match="even head dimension"):
        RotaryPositionalEmbeddings(7)
