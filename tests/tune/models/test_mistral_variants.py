"""Mistral 7B v0.3 and Mistral NeMo 12B: ``mistral_nemo_tokenizer`` (tekken ``tokenizer.json``) against
transformers' ``apply_chat_template`` on Mistral-Nemo-Instruct-2407's template, token for token, with exact loss
masks. NeMo's ``head_dim`` is checked against transformers' logits with every family's cases
(``_hf_cases.mistral_nemo_config``), the sizes against the published ``config.json`` values in
tests/tune/models/test_model_builders.py."""

import json

import pytest

from tests.recipes._family_assets import TEKKEN_CONTROL_TOKENS, tekken_tokenizer_dir
from tests.tune.data._tiny_tokenizers import as_dicts, conversation, hf_ids, random_conversations, trained_runs
from tune.data import Message, mask_messages
from tune.models.mistral import mistral_nemo_tokenizer

transformers = pytest.importorskip("transformers")

# The chat template of mistralai/Mistral-Nemo-Instruct-2407 (tokenizer_config.json): its system, user and
# assistant branches, verbatim (two long lines continued with a backslash), with the tool-calling branches left
# out (tune's format has no tool role).
NEMO_TEMPLATE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate \
user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial \
optional system message!") }}
    {%- endif %}
{%- endfor %}
"""


@pytest.fixture(scope="module")
def ours():
    return mistral_nemo_tokenizer(str(tekken_tokenizer_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tekken_tokenizer_dir() / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=NEMO_TEMPLATE,
    )


def _answers(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


def test_control_token_ids(ours):
    # tekken's layout: the control tokens are the first ids (<unk> 0, <s> 1, </s> 2, [INST] 3, [/INST] 4, <pad> 10)
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, TEKKEN_CONTROL_TOKENS.index("<pad>"))
    assert ours.special_tokens == {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4}
    assert ours.stop_tokens == [2]


def test_chat_parity_on_random_conversations_with_exact_masks(ours, reference):
    for messages in random_conversations(count=25, seed=5, system=False):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        assert _answers(ours, tokens, mask) == [m.text_content + "</s>" for m in messages if m.role == "assistant"]


def test_prompt_parity_with_a_system_message(ours, reference):
    # a prompt for generation (last message from the user): the template puts the system prompt in that turn
    for messages in random_conversations(count=10, seed=6, system=True):
        prompt = messages[:-1]
        tokens, _ = ours.tokenize_messages(prompt, add_end_tokens=False)
        assert tokens == hf_ids(reference, as_dicts(prompt), add_generation_prompt=True), as_dicts(prompt)


def test_training_conversation_keeps_its_system_prompt_in_the_last_user_turn(ours, reference):
    messages = mask_messages(conversation(system=True))
    tokens, mask = ours.tokenize_messages(messages)
    system, *rest = conversation(system=True)
    # the Hugging Face template drops the system prompt when an answer ends the conversation ...
    assert hf_ids(reference, as_dicts(rest)) == hf_ids(reference, as_dicts([system, *rest]))
    # ... tune keeps it where mistral_common puts it: before the last user turn's text
    last_user = max(i for i, m in enumerate(rest) if m.role == "user")
    moved = [*rest]
    moved[last_user] = Message("user", f"{system.text_content}\n\n{rest[last_user].text_content}")
    assert tokens == hf_ids(reference, as_dicts(moved))
    assert _answers(ours, tokens, mask) == [m.text_content + "</s>" for m in rest if m.role == "assistant"]


def test_control_token_strings_in_content_become_control_tokens_as_in_transformers(ours, reference):
    messages = [Message("user", "say [INST] and </s> please"), Message("assistant", "ok [/INST] done")]
    tokens, _ = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert tokens.count(3) == 2 and tokens.count(4) == 2 and tokens.count(2) == 2


def test_a_tokenizer_json_without_control_tokens_is_refused_naming_the_other_builder(tmp_path):
    source = json.loads((tekken_tokenizer_dir() / "tokenizer.json").read_text())
    source["added_tokens"] = [t for t in source["added_tokens"] if t["content"] != "[INST]"]
    del source["model"]["vocab"]["[INST]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(source))
    with pytest.raises(ValueError, match=r"no '\[INST\]' token.*mistral_tokenizer"):
        mistral_nemo_tokenizer(str(tmp_path))
