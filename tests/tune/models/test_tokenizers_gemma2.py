"""gemma2_tokenizer: parity with transformers' apply_chat_template on the real Gemma 2 template (and Gemma 3's for
a system prompt, which Gemma 2's template rejects), exact masks."""

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
from tune.models import gemma
from tune.models.gemma2 import gemma2_tokenizer, gemma_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of google/gemma-2-2b-it (tokenizer_config.json), verbatim.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# Chat template of google/gemma-3-4b-it (tokenizer_config.json), verbatim: it folds a system message into the
# first user turn, which is what gemma2_tokenizer does with one.
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
    return gemma2_tokenizer(str(_model_dir() / "tokenizer.model"))


def _reference(template):
    return transformers.GemmaTokenizer.from_pretrained(str(_model_dir()), chat_template=template)


def _answers(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


def test_special_ids(ours):
    assert (ours.pad_id, ours.eos_id, ours.bos_id) == (0, 1, 2)
    assert ours.stop_tokens == [1, ours.special_tokens["<end_of_turn>"]]
    assert gemma_tokenizer is gemma.gemma_tokenizer  # torchtune's gemma2 package re-exports Gemma's builder


def test_chat_parity_without_system_and_exact_mask(ours):
    messages = mask_messages(conversation(system=False))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(_reference(GEMMA2_TEMPLATE), as_dicts(messages))
    expected = [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]
    assert _answers(ours, tokens, mask) == expected


def test_system_prompt_is_folded_like_gemma3(ours):
    messages = mask_messages(conversation(system=True))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(_reference(GEMMA3_TEMPLATE), as_dicts(messages))
    with pytest.raises(Exception, match="System role not supported"):  # why Gemma 3's template is the reference
        hf_ids(_reference(GEMMA2_TEMPLATE), as_dicts(messages))
    expected = [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]
    assert _answers(ours, tokens, mask) == expected


def test_generation_prompt_parity(ours):
    messages = mask_messages(conversation(system=False)[:-1])
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(_reference(GEMMA2_TEMPLATE), as_dicts(messages), add_generation_prompt=True)


def test_encode_has_no_dummy_prefix(ours):
    text = "Hello  world, café 42"
    reference = _reference(GEMMA2_TEMPLATE)
    assert ours.encode(text, add_bos=False, add_eos=False) == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ours.encode(text)) == text


def test_tool_role_is_refused(ours):
    with pytest.raises(ValueError, match="gemma2 chat format does not support"):
        ours.tokenize_messages([Message("user", "x"), Message("tool", "y")])


@pytest.mark.parametrize("system", [False, True])
def test_parity_on_random_conversations(ours, system):
    reference = _reference(GEMMA3_TEMPLATE if system else GEMMA2_TEMPLATE)
    for messages in random_conversations(count=25, seed=1, system=system):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert runs == [m.text_content.strip() + "<end_of_turn>" for m in messages if m.role == "assistant"]


def test_builder_returns_torchtune_class(ours):
    from tune.models.gemma import GemmaTokenizer

    assert isinstance(ours, GemmaTokenizer)
    tokenizer = GemmaTokenizer(str(_model_dir() / "tokenizer.model"), 16)
    assert tokenizer.max_seq_len == 16
    assert tokenizer.encode("hello world") == ours.encode("hello world")
