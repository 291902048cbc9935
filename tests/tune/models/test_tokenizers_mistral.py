"""mistral_tokenizer: parity with transformers' apply_chat_template on the real Mistral template, exact masks."""

import pytest

from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    legacy_sentencepiece_reference,
    random_conversations,
    sentencepiece_model,
    torchtune_no_template_reference,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.mistral._tokenizer import mistral_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of mistralai/Mixtral-8x7B-Instruct-v0.1 (tokenizer_config.json; Mistral-7B-Instruct-v0.2 carries
# the same one), verbatim.
MISTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""


@pytest.fixture(scope="module")
def ours():
    return mistral_tokenizer(str(sentencepiece_model() / "tokenizer.model"))


@pytest.fixture(scope="module")
def reference():
    return legacy_sentencepiece_reference(sentencepiece_model(), MISTRAL_TEMPLATE)


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
    # content is not stripped by this template; the template's " " before the answer is inside its first token
    assert runs == [m.text_content + "</s>" for m in messages if m.role == "assistant"]


def test_train_on_all_trains_everything_after_bos(ours):
    messages = mask_messages(conversation(), "all")
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens[0] == ours.bos_id
    assert mask == [True] + [False] * (len(tokens) - 1)


def test_train_on_last_trains_only_the_last_answer(ours):
    messages = mask_messages(conversation(), "last")
    tokens, mask = ours.tokenize_messages(messages)
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
    assert runs == [messages[-1].text_content + "</s>"]


def test_roles_and_empty_content_errors(ours):
    with pytest.raises(ValueError, match="a user message must follow the system message"):
        ours.tokenize_messages([Message("system", "s"), Message("assistant", "a")])
    with pytest.raises(ValueError, match=r"message 1 \(assistant\) has empty content"):
        ours.tokenize_messages([Message("user", "q"), Message("assistant", "  ")])


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=1):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        # sentencepiece's decode drops one leading space (it reads it as the dummy prefix)
        answers = [
            m.text_content[1:] if m.text_content.startswith(" ") else m.text_content
            for m in messages
            if m.role == "assistant"
        ]
        assert runs == [a + "</s>" for a in answers]


def test_no_template_matches_torchtune_rule():
    # prompt_template=None: torchtune's mistral tokenizer then lays messages out like llama2's, with no [INST] tags
    # (rule in torchtune_no_template_reference, which encodes with sentencepiece directly)
    path = sentencepiece_model() / "tokenizer.model"
    tok = mistral_tokenizer(str(path), prompt_template=None)
    strategies = ["train_on_assistant", "train_on_all", "train_on_last"]
    for i, messages in enumerate(random_conversations(count=30, seed=4)):
        messages = mask_messages(messages, strategies[i % 3])
        assert tok.tokenize_messages(messages) == torchtune_no_template_reference(path, messages)


def test_template_names_select_the_chat_format(ours):
    path = str(sentencepiece_model() / "tokenizer.model")
    messages = mask_messages(conversation())
    expected = ours.tokenize_messages(messages)  # the default: MistralChatTemplate, as in torchtune
    for name in ["tune.models.mistral.MistralChatTemplate", "torchtune.models.mistral.MistralChatTemplate"]:
        assert mistral_tokenizer(path, prompt_template=name).tokenize_messages(messages) == expected
    assert "[INST]" in ours.decode(expected[0])


def test_torchtune_class_with_template_instance_gives_the_builders_tokens(ours):
    from tune.models.mistral import MistralChatTemplate, MistralTokenizer

    tokenizer = MistralTokenizer(str(sentencepiece_model() / "tokenizer.model"), prompt_template=MistralChatTemplate())
    messages = mask_messages(conversation(system=True))
    assert isinstance(ours, MistralTokenizer)
    assert tokenizer.tokenize_messages(messages) == ours.tokenize_messages(messages)
    folded = MistralChatTemplate()([Message("system", "S"), Message("user", "U")])
    assert [(m.role, m.text_content) for m in folded] == [("user", "[INST] S\n\nU [/INST] ")]
