"""FullModelHFCheckpointer on reward (sequence-classification) checkpoints written by transformers: with torchtune's
`model_type: REWARD` or the family's own name, `score.weight` loads as the classifier's `output.weight` (scores
equal transformers' within 1e-5), and the saved model loads back in transformers with the trained weights."""

import pytest
import torch

from tests.tune.models._hf_cases import _llama, build_hf_model, decoder_dims, llama2_config, mistral_config
from tune.models.llama2 import llama2_classifier
from tune.models.llama3_2 import llama3_2_classifier
from tune.models.mistral import mistral_classifier
from tune.training.checkpointing import (
    MODEL_KEY,
    FullModelHFCheckpointer,
    FullModelTorchTuneCheckpointer,
)

transformers = pytest.importorskip("transformers")


def _save_hf_reward_model(config, directory):
    config.num_labels, config.pad_token_id = 1, 0
    causal = build_hf_model(config)
    model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    state = {key: value for key, value in causal.state_dict().items() if key.startswith("model.")}
    state["score.weight"] = torch.randn(1, config.hidden_size, generator=torch.Generator().manual_seed(3))
    model.load_state_dict(state)
    model.save_pretrained(directory)
    return model.eval()


def _classifier(config, family):
    dims = dict(num_classes=1, **decoder_dims(config))
    if family == "mistral":
        return mistral_classifier(**dims, sliding_window=config.sliding_window)
    if family == "llama3_2":
        return llama3_2_classifier(**dims, rope_base=500_000.0, scale_factor=32.0)
    return llama2_classifier(**dims)


@pytest.mark.parametrize(
    "family, model_type",
    [("mistral", "REWARD"), ("mistral", "MISTRAL"), ("llama2", "REWARD"), ("llama3_2", "LLAMA3_2")],
)
def test_reward_checkpoint_loads_scores_and_saves_for_transformers(tmp_path, family, model_type):
    if family == "mistral":
        config = mistral_config()
    elif family == "llama2":
        config = llama2_config()
    else:  # Llama 3.2's RoPE scaling; its config ties the LM head, while a classifier's `score` head is never tied
        scaling = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0)
        scaling["original_max_position_embeddings"] = 8192
        config = _llama(rope_theta=500_000.0, rope_scaling=scaling, tie_word_embeddings=True)
    hf = _save_hf_reward_model(config, tmp_path / "rm")
    ckpt = FullModelHFCheckpointer(tmp_path / "rm", model_type=model_type, output_dir=tmp_path / "out")
    state = ckpt.load_checkpoint()[MODEL_KEY]
    assert "output.weight" in state and not any(key.startswith("score") for key in state)
    model = _classifier(config, family).eval()
    model.load_state_dict(state)
    tokens = torch.randint(1, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, -1, 0], hf(tokens).logits[:, 0], atol=1e-5, rtol=1e-5)
        for param in model.parameters():
            param.add_(0.01)  # "training"
    out = ckpt.save_checkpoint({MODEL_KEY: model.state_dict()}, epoch=0)
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded.score.weight, model.output.weight)
        torch.testing.assert_close(model(tokens)[:, -1, 0], reloaded(tokens).logits[:, 0], atol=1e-5, rtol=1e-5)


def test_reward_model_type_needs_a_config_json(tmp_path):
    (tmp_path / "rm").mkdir()
    torch.save({"output.weight": torch.zeros(1, 4)}, tmp_path / "rm" / "model.pt")
    with pytest.raises(ValueError, match="FullModelHFCheckpointer"):
        FullModelTorchTuneCheckpointer(tmp_path / "rm", ["model.pt"], model_type="REWARD", output_dir=tmp_path / "o")
