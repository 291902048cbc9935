"""tune.models.gemma (Gemma 2B/7B): the tokenizer's chat format against transformers on the ``-it`` template, the
family's ``config.json`` checks, and torchtune's Gemma checkpoint layout. Logits and round trips against
transformers run with every family's (tests/tune/models/test_hf.py, ``_hf_cases.gemma_config``)."""

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    gemma_sentencepiece_model,
    hf_ids,
    random_conversations,
    trained_runs,
)
from tests.tune.models._chat_templates import GEMMA2_TEMPLATE
from tests.tune.models._hf_cases import gemma_config
from tests.tune.training.checkpointing.test_torchtune_layout import (  # noqa: F401 - the fixtures
    _checkpointer,
    _tune_model,
    _write_torchtune_checkpoint,
    torchtune_converters,
    torchtune_wheel,
)
from tune.data import Message, mask_messages
from tune.models.gemma import GemmaTokenizer, gemma_from_hf_config, gemma_tokenizer
from tune.training.checkpointing import MODEL_KEY

transformers = pytest.importorskip("transformers")

# Chat template of google/gemma-7b-it (tokenizer_config.json; google/gemma-2b-it's is the same), verbatim.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


@pytest.fixture(scope="module")
def ours():
    # tune's Hugging Face-exact format; the default (torchtune's layout) gives torchtune's tokens
    # (tests/recipes/test_torchtune_tokens.py)
    return gemma_tokenizer(
        str(gemma_sentencepiece_model() / "tokenizer.model"), prompt_template="tune.data.GemmaChatFormat"
    )


@pytest.fixture(scope="module")
def reference():
    return transformers.GemmaTokenizer.from_pretrained(str(gemma_sentencepiece_model()), chat_template=GEMMA_TEMPLATE)


def test_gemma_template_is_gemma2s_so_one_tokenizer_serves_both(ours):
    assert GEMMA_TEMPLATE == GEMMA2_TEMPLATE
    from tune.models.gemma2 import GemmaTokenizer as Gemma2Tokenizer
    from tune.models.gemma2 import gemma_tokenizer as gemma2_gemma_tokenizer

    assert Gemma2Tokenizer is GemmaTokenizer and isinstance(ours, GemmaTokenizer)
    other = gemma2_gemma_tokenizer(
        str(gemma_sentencepiece_model() / "tokenizer.model"), prompt_template="tune.data.Gemma2ChatFormat"
    )  # the name Gemma 2's package keeps
    assert other.tokenize_messages(conversation(system=False)) == ours.tokenize_messages(conversation(system=False))


def test_special_ids(ours):
    assert (ours.pad_id, ours.eos_id, ours.bos_id) == (0, 1, 2)
    assert ours.stop_tokens == [1, ours.special_tokens["<end_of_turn>"]]


def test_chat_parity_on_random_conversations_with_exact_masks(ours, reference):
    for messages in random_conversations(count=25, seed=3, system=False):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert runs == [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(conversation(system=False)[:-1])
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)


def test_system_message_is_folded_into_the_first_user_turn(ours, reference):
    # Gemma's template refuses a system message; tune folds it in as Gemma 3's template does
    with pytest.raises(Exception, match="System role not supported"):
        hf_ids(reference, as_dicts(conversation(system=True)))
    folded = [Message("user", "You are a helpful assistant. Answer in one line.\n\nWhat is the capital of France?")]
    folded += conversation(system=False)[1:]
    assert ours.tokenize_messages(conversation(system=True))[0] == hf_ids(reference, as_dicts(folded))


def _config(**overrides) -> dict:
    return {**gemma_config().to_dict(), **overrides}


def test_from_hf_config_has_only_the_two_pre_norms_per_layer():
    model = gemma_from_hf_config(_config())
    layer_keys = {key.split(".", 2)[2] for key in model.state_dict() if key.startswith("layers.0.")}
    assert {key for key in layer_keys if "norm" in key or "scale" in key} == {"sa_norm.weight", "mlp_norm.weight"}


def test_from_hf_config_reads_the_legacy_gelu_name_as_tanh_gelu():
    # google/gemma-2b's config.json says hidden_act "gelu", which transformers reads as the tanh approximation
    assert transformers.GemmaConfig(hidden_act="gelu").hidden_act == "gelu_pytorch_tanh"
    for name in ("gelu", "gelu_pytorch_tanh"):
        activation = gemma_from_hf_config(_config(hidden_act=name)).layers[0].mlp.activation
        assert isinstance(activation, torch.nn.GELU) and activation.approximate == "tanh"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_act="silu"), "activation 'silu'"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=false"),
        (dict(attention_bias=True), "attention_bias=true"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "RoPE scaling 'linear'"),
    ],
)
def test_from_hf_config_refuses_what_gemma_is_not(overrides, message):
    with pytest.raises(ValueError, match=message):
        gemma_from_hf_config(_config(**overrides))


def test_torchtune_layout_loads_with_transformers_logits_and_is_written_back_unchanged(
    torchtune_converters,  # noqa: F811
    tmp_path,
):
    # torchtune's Gemma checkpoints: its generic converter (interleaved q/k rows, norms named `scale`)
    directory, state, hf_model = _write_torchtune_checkpoint(torchtune_converters, "gemma", tmp_path)
    assert "norm.scale" in state and "layers.0.sa_norm.scale" in state
    checkpointer = _checkpointer(directory, "gemma", tmp_path / "out")
    model = _tune_model("gemma")
    model.load_state_dict(checkpointer.load_checkpoint()[MODEL_KEY])  # strict: every key maps
    tokens = torch.randint(0, assets.vocab_size("gemma"), (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(tokens).logits, rtol=1e-5, atol=1e-5)
    from safetensors.torch import load_file

    (weights,) = checkpointer.save_checkpoint({MODEL_KEY: model.state_dict()}, epoch=0).glob("*.safetensors")
    written = load_file(weights)
    assert written.keys() == state.keys()
    assert all(torch.equal(written[key], state[key]) for key in state)
