"""tune.models.from_hf / to_hf_state_dict against transformers, for every family.

Each case builds a tiny random transformers model (tests/tune/models/_hf_cases.py), saves it with
save_pretrained, loads it with from_hf and compares logits on a left-padded batch at the non-padding positions.
"""

import json

import pytest
import torch

from tests.tune.models._hf_cases import CASES, build_hf_model, padded_batch
from tune.models import from_hf, to_hf_state_dict
from tune.modules import get_causal_mask_from_padding_mask

pytest.importorskip("transformers")


def _logits(hf_model, model):
    tokens, attention_mask, positions = padded_batch()
    with torch.no_grad():
        expected = hf_model(tokens, attention_mask=attention_mask, position_ids=positions).logits
        mask = get_causal_mask_from_padding_mask(attention_mask.bool())
        actual = model(tokens, mask=mask, input_pos=positions)
    real = attention_mask.bool()
    return expected[real], actual[real]


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_hf_matches_transformers_logits_on_padded_batch(case, tmp_path):
    hf_model = build_hf_model(CASES[case]())
    hf_model.save_pretrained(tmp_path)
    model = from_hf(tmp_path, dtype=torch.float32)
    expected, actual = _logits(hf_model, model)
    error = (expected - actual).abs().max().item()
    print(f"{case}: max abs logit error {error:.3e}")
    assert actual.dtype == torch.float32
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
    assert error < 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_to_hf_state_dict_round_trips_exactly(case, tmp_path):
    hf_model = build_hf_model(CASES[case]())
    hf_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    model = from_hf(tmp_path, dtype=torch.float32)
    converted = to_hf_state_dict(model, config)
    expected = hf_model.state_dict()
    if config.get("tie_word_embeddings"):
        expected.pop("lm_head.weight")  # written once, as save_pretrained does
    assert sorted(converted) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(converted[key], value), key


def test_from_hf_loads_sharded_checkpoints(tmp_path):
    hf_model = build_hf_model(CASES["qwen3"]())
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model = from_hf(tmp_path, dtype=torch.float32)
    expected, actual = _logits(hf_model, model)
    assert (expected - actual).abs().max().item() < 1e-5


def test_from_hf_casts_to_the_requested_dtype(tmp_path):
    build_hf_model(CASES["llama3_2"]()).save_pretrained(tmp_path)
    model = from_hf(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    logits = model(torch.tensor([[5, 6, 7]]))
    assert torch.isfinite(logits).all()


def test_from_hf_rejects_unsupported_architecture_listing_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="Unsupported Hugging Face model_type 'gpt2'.*gemma2.*llama.*qwen3"):
        from_hf(tmp_path)


def test_from_hf_names_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_hf(tmp_path)


def test_from_hf_rejects_checkpoint_missing_weights(tmp_path):
    from safetensors.torch import save_file

    hf_model = build_hf_model(CASES["llama2"]())
    hf_model.save_pretrained(tmp_path)
    state = {k: v for k, v in hf_model.state_dict().items() if "layers.1.mlp" not in k}
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks 3 weight"):
        from_hf(tmp_path)
