"""LongRoPE (tune/modules/_long_rope.py) against transformers' ``longrope`` RoPE, alone and in a tiny Phi-3.

The tiny config has a pre-training context of 8 positions (``original_max_position_embeddings``) in 64, so
sequences of 6 use the short factors and sequences of 12 or 20 the long ones. The factor lists are arbitrary
(5 = head_dim / 2 values each, different per pair and between the lists) so that a wrong list or regime moves the
result.
"""

import json
import math

import pytest
import torch

from tests.tune.models._hf_cases import build_hf_model
from tune.models import from_hf, to_hf_state_dict
from tune.modules import LongRoPE, RotaryPositionalEmbeddings

transformers = pytest.importorskip("transformers")

SHORT = [1.0, 1.5, 2.0, 3.0, 4.0]
LONG = [2.0, 3.0, 5.0, 8.0, 13.0]
ORIGINAL, MAX_POSITIONS, HEAD_DIM = 8, 64, 10


def _config(**overrides):
    kwargs = dict(
        vocab_size=101,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=dict(rope_type="longrope", short_factor=SHORT, long_factor=LONG),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(overrides)
    return transformers.Phi3Config(**kwargs)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny transformers Phi-3 with longrope, and tune's model loaded from its saved checkpoint."""
    directory = tmp_path_factory.mktemp("phi3_longrope")
    hf_model = build_hf_model(_config())
    hf_model.save_pretrained(directory)
    return hf_model, from_hf(directory, dtype=torch.float32), directory


def _hf_rotate(config, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    rotary = Phi3RotaryEmbedding(config)
    cos, sin = rotary(x, positions)
    rotated, _ = apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos, sin)
    return rotated.transpose(1, 2)


@pytest.mark.parametrize(
    "positions",
    [
        torch.arange(6)[None].expand(2, 6),  # short: 6 <= 8
        torch.arange(20)[None].expand(2, 20),  # long
        torch.stack([torch.arange(6), torch.arange(6) + 10]),  # one row reaches position 15: long for both rows
        torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]]),  # packed documents within the original context: short
    ],
    ids=["short", "long", "batch-max-decides", "packed-short"],
)
def test_rotation_matches_transformers(positions):
    config = _config()
    x = torch.randn(positions.shape[0], positions.shape[1], 3, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    rope = LongRoPE(HEAD_DIM, MAX_POSITIONS, 10_000.0, SHORT, LONG, original_max_seq_len=ORIGINAL)
    expected = _hf_rotate(config, x, positions)
    torch.testing.assert_close(rope(x, input_pos=positions), expected, atol=1e-6, rtol=0)
    if torch.equal(positions, torch.arange(positions.shape[1]).expand_as(positions)):
        torch.testing.assert_close(rope(x), expected, atol=1e-6, rtol=0)  # input_pos=None: the same regime rule


def test_attention_factor_is_the_published_formula():
    # Phi-3-mini-128k: 131072 positions over a 4096 pre-training context, no explicit factors in config.json
    rope = LongRoPE(96, 8, 10_000.0, [1.0] * 48, [1.0] * 48, original_max_seq_len=4096, scale_factor=131072 / 4096)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert LongRoPE(4, 8, 1.0, [1, 1], [1, 1], original_max_seq_len=8).attention_factor == 1.0  # no extension
    plain = RotaryPositionalEmbeddings(4, 8, 1.0)
    x = torch.randn(1, 8, 1, 4)
    unit = LongRoPE(4, 8, 1.0, [1, 1], [1, 1], original_max_seq_len=8, attention_factor=1.0)
    torch.testing.assert_close(unit(x), plain(x))  # unit factors, no attention factor: plain RoPE
    with pytest.raises(ValueError, match="long_factor has 3 entries"):
        LongRoPE(4, 8, 1.0, [1, 1], [1, 1, 1], original_max_seq_len=8)


@pytest.mark.parametrize("seq_len", [6, 12, 20])
def test_phi3_longrope_logits_match_transformers(models, seq_len):
    hf_model, model, _ = models
    tokens = torch.randint(3, 101, (2, seq_len), generator=torch.Generator().manual_seed(seq_len))
    with torch.no_grad():
        expected = hf_model(tokens).logits
        actual = model(tokens)
    error = (expected - actual).abs().max().item()
    print(f"seq_len {seq_len}: max abs logit error {error:.3e}")
    assert expected.abs().max() > 1.0 and error < 1e-5
    if seq_len > ORIGINAL:  # the long factors changed the logits of the first tokens too (the test can fail)
        with torch.no_grad():
            prefix = model(tokens[:, :6])
        assert (prefix - actual[:, :6]).abs().max() > 1e-3


def test_from_hf_builds_longrope_and_round_trips_through_the_converter(models):
    hf_model, model, directory = models
    rope = model.layers[0].attn.pos_embeddings
    assert isinstance(rope, LongRoPE) and all(layer.attn.pos_embeddings is rope for layer in model.layers)
    assert (rope.short_factor, rope.long_factor, rope.original_max_seq_len) == (tuple(SHORT), tuple(LONG), ORIGINAL)
    config = json.loads((directory / "config.json").read_text())
    converted = to_hf_state_dict(model, config)
    expected = hf_model.state_dict()
    assert sorted(converted) == sorted(expected)
    assert all(torch.equal(converted[key], value) for key, value in expected.items())


def test_kv_cache_decoding_matches_full_forward_in_each_regime(models):
    _, model, _ = models
    tokens = torch.randint(3, 101, (2, 20), generator=torch.Generator().manual_seed(3))
    cases = ((3, 8), (10, 20))  # (prompt, total): all within the original context; all past it
    with torch.no_grad():
        full = {total: model(tokens[:, :total]) for _, total in cases}
        model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=MAX_POSITIONS)
        try:
            for prompt, total in cases:
                model.reset_caches()
                steps = [model(tokens[:, :prompt])] + [model(tokens[:, i : i + 1]) for i in range(prompt, total)]
                torch.testing.assert_close(torch.cat(steps, dim=1), full[total], atol=1e-5, rtol=0)
        finally:
            model.delete_caches()


def test_kv_cache_crossing_the_original_context_matches_transformers(models):
    """Decoding from 6 to 12 tokens: keys cached in the short regime keep their rotation, later steps use the long
    factors, exactly as transformers' cached generation does."""
    hf_model, model, _ = models
    tokens = torch.randint(3, 101, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = transformers.DynamicCache(config=hf_model.config)
        out = hf_model(tokens[:, :6], past_key_values=cache, use_cache=True)
        expected = [out.logits]
        for i in range(6, 12):
            out = hf_model(tokens[:, i : i + 1], past_key_values=out.past_key_values, use_cache=True)
            expected.append(out.logits)
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=MAX_POSITIONS)
        try:
            actual = [model(tokens[:, :6])] + [model(tokens[:, i : i + 1]) for i in range(6, 12)]
        finally:
            model.delete_caches()
    torch.testing.assert_close(torch.cat(actual, dim=1), torch.cat(expected, dim=1), atol=1e-5, rtol=0)


def test_unsupported_scaling_is_a_clear_error():
    from tune.models.phi3 import phi3_from_hf_config

    config = _config().to_dict()
    config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "yarn_like"}
    with pytest.raises(ValueError, match="'yarn_like'.*supported: default"):
        phi3_from_hf_config(config)
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10_000.0, "short_factor": SHORT}
    config.pop("original_max_position_embeddings")
    with pytest.raises(ValueError, match="lacks.*long_factor.*original_max_position_embeddings"):
        phi3_from_hf_config(config)


def test_named_128k_size_reads_the_factors_from_config_json(tmp_path):
    from tune.models.phi3 import lora_phi3_mini_128k, phi3_mini_128k

    short, long = [1.0 + i / 100 for i in range(48)], [2.0 + i for i in range(48)]
    rope = {"rope_type": "longrope", "short_factor": short, "long_factor": long}  # transformers 4's layout
    config = {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": rope}))
    with torch.device("meta"):
        for model in (phi3_mini_128k(str(tmp_path)), lora_phi3_mini_128k(["q_proj"], hf_config_path=str(tmp_path))):
            built = model.layers[0].attn.pos_embeddings
            assert (built.short_factor, built.long_factor) == (tuple(short), tuple(long))
            assert (built.original_max_seq_len, built.max_seq_len) == (4096, 131072)
            assert built.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
        with pytest.raises(FileNotFoundError, match="No config.json"):
            phi3_mini_128k(str(tmp_path / "missing"))
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match="no longrope rope_scaling"):
            phi3_mini_128k(str(tmp_path))
