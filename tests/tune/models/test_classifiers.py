"""Classifier and reward builders (llama2_classifier, mistral_classifier, *_reward_7b) against transformers'
*ForSequenceClassification: the same weights give the ``score`` head's output at every position, and at the last
position the model's pooled logits."""

import pytest
import torch

from tests.tune.models._hf_cases import build_hf_model, decoder_dims, llama2_config, mistral_config
from tune.models.llama2 import llama2_classifier, llama2_reward_7b, llama_hf_to_tune, lora_llama2_classifier
from tune.models.mistral import mistral_classifier, mistral_hf_to_tune, mistral_reward_7b
from tune.modules.peft import LoRALinear

transformers = pytest.importorskip("transformers")

NUM_CLASSES = 3


def _hf_classifier(config):
    config.num_labels, config.pad_token_id = NUM_CLASSES, 0
    causal = build_hf_model(config)  # random weights large enough to matter
    model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    state = {key: value for key, value in causal.state_dict().items() if key.startswith("model.")}
    state["score.weight"] = 0.1 * torch.randn(NUM_CLASSES, config.hidden_size)
    model.load_state_dict(state)
    return model.eval()


def _dims(config) -> dict:
    return dict(num_classes=NUM_CLASSES, **decoder_dims(config))


@pytest.mark.parametrize("family", ["llama2", "mistral"])
def test_classifier_scores_every_position_as_transformers_score_head(family):
    if family == "llama2":
        config = llama2_config()
        hf, model = _hf_classifier(config), llama2_classifier(**_dims(config))
        convert = llama_hf_to_tune
    else:
        config = mistral_config()
        hf = _hf_classifier(config)
        model = mistral_classifier(**_dims(config), rope_base=10_000.0, sliding_window=config.sliding_window)
        convert = mistral_hf_to_tune
    state = {("lm_head.weight" if k == "score.weight" else k): v for k, v in hf.state_dict().items()}
    model.load_state_dict(convert(state, config.to_dict()))
    tokens = torch.randint(1, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = hf.model(tokens).last_hidden_state
        expected = hf.score(hidden)  # [b, s, num_classes]
        pooled = hf(tokens).logits  # no padding: the last position
        actual = model(tokens)
    assert actual.shape == (2, 12, NUM_CLASSES)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual[:, -1], pooled, atol=1e-5, rtol=1e-5)


def test_reward_builders_have_one_output_on_the_7b_body():
    with torch.device("meta"):
        llama, mistral = llama2_reward_7b(), mistral_reward_7b()
    assert (llama.output.in_features, llama.output.out_features) == (4096, 1)
    assert llama.layers[0].mlp.w1.out_features == 11008  # torchtune's computed Llama 2 width
    assert (mistral.output.out_features, len(mistral.layers)) == (1, 32)
    assert {layer.attn.sliding_window for layer in mistral.layers} == {None}


def test_lora_classifier_can_adapt_the_head():
    model = lora_llama2_classifier(
        ["q_proj"], apply_lora_to_output=True, **_dims(llama2_config()), lora_rank=2, lora_alpha=4.0
    )
    assert isinstance(model.output, LoRALinear) and model.output.out_dim == NUM_CLASSES
