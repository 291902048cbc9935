"""gemma3_tokenizer: token-exact parity with transformers' apply_chat_template on Gemma 3's published chat template
(a system prompt folded into the first user turn), exact masks, on the tiny Gemma SentencePiece model."""

import pytest

from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    random_conversations,
    sentencepiece_model,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.gemma3 import gemma3_tokenizer
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

# Chat template of google/gemma-3-1b-it (tokenizer_config.json; the 4B, 12B and 27B instruct releases ship the same
# one), verbatim.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def _model_dir():
    # Gemma's SentencePiece model: no dummy prefix, <start_of_turn>/<end_of_turn> as pieces, pad 0 / eos 1 / bos 2
    return sentencepiece_model(dummy_prefix=False, gemma=True)


@pytest.fixture(scope="module")
def ours():
    return gemma3_tokenizer(str(_model_dir() / "tokenizer.model"))


@pytest.fixture(scope="module")
def reference():
    return transformers.GemmaTokenizer.from_pretrained(str(_model_dir()), chat_template=GEMMA3_TEMPLATE)


def _answers(ours, tokens, mask):
    """The trained runs of a tokenized conversation, decoded."""
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


def test_family_tokenizer_and_special_ids(ours):
    assert get_model_family("gemma3").tokenizer is gemma3_tokenizer
    assert (ours.pad_id, ours.eos_id, ours.bos_id) == (0, 1, 2)
    assert ours.stop_tokens == [1, ours.special_tokens["<end_of_turn>"]]


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_only_model_turns_trained(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    if system:  # the system text opens the first user turn, followed by a blank line
        text = ours.decode(tokens, skip_special_tokens=False)
        assert f"<start_of_turn>user\n{messages[0].text_content}\n\n" in text
    expected = [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]
    assert _answers(ours, tokens, mask) == expected


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(conversation(system=True)[:-1])
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    assert ours.decode(tokens, skip_special_tokens=False).endswith("<end_of_turn>\n<start_of_turn>model\n")


def test_parity_on_random_conversations(ours, reference):
    for system in (False, True):
        for messages in random_conversations(count=15, seed=3, system=system):
            tokens, mask = ours.tokenize_messages(mask_messages(messages))
            assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
            expected = [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]
            assert _answers(ours, tokens, mask) == expected


def test_tool_role_is_refused(ours):
    with pytest.raises(ValueError, match="chat format does not support"):
        ours.tokenize_messages([Message("user", "x"), Message("tool", "y")])
