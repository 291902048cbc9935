"""phi3_hf_to_tune / phi3_tune_to_hf with torchtune's arguments: the same split as the registry's converter, which
reads the sizes from config.json."""

import pytest
import torch

from tune.models.phi3 import phi3_hf_to_tune, phi3_hf_to_tune_from_config, phi3_tune_to_hf

HF_CONFIG = {"num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 60}


def _hf_state(kv_rows: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.self_attn.qkv_proj.weight": torch.randn(60 + 2 * kv_rows, 60, generator=generator),
        "model.layers.0.mlp.gate_up_proj.weight": torch.randn(2 * 94, 60, generator=generator),
        "model.norm.weight": torch.randn(60, generator=generator),
    }


def test_torchtune_arguments_split_grouped_query_qkv_as_the_config_does():
    hf = _hf_state(kv_rows=20)
    ours = phi3_hf_to_tune(hf, num_heads=6, num_kv_heads=2, dim=60)
    expected = phi3_hf_to_tune_from_config(hf, HF_CONFIG)
    assert sorted(ours) == sorted(expected)
    assert all(torch.equal(ours[key], expected[key]) for key in ours)
    assert ours["layers.0.attn.k_proj.weight"].shape == (20, 60)
    back = phi3_tune_to_hf(ours)
    assert all(torch.equal(back[key], hf[key]) for key in hf)


def test_without_dim_qkv_splits_in_three_equal_blocks():
    hf = _hf_state(kv_rows=60)
    ours = phi3_hf_to_tune(hf, None, None, None)
    q, k, v = hf["model.layers.0.self_attn.qkv_proj.weight"].chunk(3)
    assert torch.equal(ours["layers.0.attn.q_proj.weight"], q) and torch.equal(ours["layers.0.attn.v_proj.weight"], v)
    with pytest.raises(ValueError, match="num_heads"):
        phi3_hf_to_tune(hf, None, None, 60)
