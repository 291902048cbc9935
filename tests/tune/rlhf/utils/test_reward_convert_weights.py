"""tune/rlhf/utils/_convert_weights.py: a transformers *ForSequenceClassification reward model converted with
reward_hf_to_tune scores a padded batch as transformers does (the score at each row's last non-padding token),
and reward_tune_to_hf gives the original state dict back."""

import pytest
import torch

from tests.tune.models._hf_cases import build_hf_model, llama2_config, mistral_config
from tune.models.llama2 import llama2_classifier
from tune.models.mistral import mistral_classifier
from tune.rlhf.utils import reward_hf_to_tune, reward_tune_to_hf

transformers = pytest.importorskip("transformers")
PAD = 0


def _hf_reward_model(config):
    config.num_labels, config.pad_token_id = 1, PAD
    causal = build_hf_model(config)
    model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    state = {key: value for key, value in causal.state_dict().items() if key.startswith("model.")}
    state["score.weight"] = torch.randn(1, config.hidden_size, generator=torch.Generator().manual_seed(3))
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("family", ["llama2", "mistral"])
def test_reward_model_scores_like_transformers(family):
    config = llama2_config() if family == "llama2" else mistral_config()
    hf = _hf_reward_model(config)
    dims = dict(
        num_classes=1,
        vocab_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        embed_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_seq_len=config.max_position_embeddings,
        norm_eps=config.rms_norm_eps,
    )
    if family == "llama2":
        model = llama2_classifier(**dims)
    else:
        model = mistral_classifier(**dims, sliding_window=config.sliding_window)
    hf_state = hf.state_dict()
    model.load_state_dict(reward_hf_to_tune({**hf_state, "score.bias": torch.zeros(1)}))  # a TRL-style bias is dropped
    tokens = torch.randint(1, config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([12, 7, 3])
    tokens[torch.arange(12)[None] >= lengths[:, None]] = PAD  # right padding
    with torch.no_grad():
        expected = hf(tokens).logits.squeeze(-1)  # [b]: the score at the last non-padding token
        scores = model(tokens).squeeze(-1)  # [b, s]: a score per position; padding after a row is never attended
    actual = scores.gather(1, (lengths - 1)[:, None]).squeeze(-1)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    back = reward_tune_to_hf(model.state_dict())
    assert back.keys() == hf_state.keys()
    assert all(torch.equal(back[key], hf_state[key]) for key in back)


def test_unknown_keys_are_listed():
    with pytest.raises(ValueError, match="lm_head.weight"):
        reward_hf_to_tune({"lm_head.weight": torch.zeros(2, 2)})
