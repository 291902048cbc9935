"""qwen2_5_tokenizer: parity with transformers' apply_chat_template on the real Qwen 2.5 template, exact masks."""

import pytest

from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    qwen_tokenizer_json,
    random_conversations,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.qwen2_5._tokenizer import qwen2_5_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of Qwen/Qwen2.5-7B-Instruct (tokenizer_config.json), verbatim.
QWEN2_5_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


@pytest.fixture(scope="module")
def ours():
    return qwen2_5_tokenizer(str(qwen_tokenizer_json() / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(qwen_tokenizer_json() / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN2_5_TEMPLATE,
    )


def _runs(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    # without a system message the real template inserts its default system prompt; so do we (never trained)
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert _runs(ours, tokens, mask) == [m.text_content + "<|im_end|>" for m in messages if m.role == "assistant"]
    if not system:
        assert "You are Qwen, created by Alibaba Cloud." in ours.decode(tokens)


def test_tool_turns_and_generation_prompt_parity(ours, reference):
    messages = [
        Message("user", "What is 2 + 2?"),
        Message("assistant", "Let me call the tool."),
        Message("tool", "4"),
        Message("tool", "four"),
        Message("assistant", "It is 4."),
        Message("user", "Thanks!"),
    ]
    mask_messages(messages)
    tokens, mask = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    assert _runs(ours, tokens, mask) == ["Let me call the tool.<|im_end|>", "It is 4.<|im_end|>"]


def test_ids_and_vocab_merges_route(ours):
    assert ours.bos_id is None
    assert ours.eos_id == ours.pad_id == ours.special_tokens["<|endoftext|>"]
    assert ours.stop_tokens == [ours.special_tokens["<|im_end|>"], ours.eos_id]
    # torchtune's arguments (vocab.json + merges.txt) build the same tokenizer as the tokenizer.json
    directory = qwen_tokenizer_json()
    from_files = qwen2_5_tokenizer(str(directory / "vocab.json"), merges_file=str(directory / "merges.txt"))
    messages = mask_messages(conversation())
    assert from_files.tokenize_messages(messages) == ours.tokenize_messages(messages)
    assert from_files.special_tokens == ours.special_tokens
    with pytest.raises(ValueError, match="merges_file"):
        qwen2_5_tokenizer(str(directory / "vocab.json"))


def test_encode_treats_special_strings_as_text(ours, reference):
    text = "Ünïcode text, 123 <|im_end|> end"
    assert ours.encode(text, add_bos=True, add_eos=False) == reference(text, split_special_tokens=True)["input_ids"]
    assert ours.decode(ours.encode(text, add_eos=False)) == text


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=1):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert runs == [m.text_content + "<|im_end|>" for m in messages if m.role == "assistant"]


def test_torchtune_keyword_options_accepted_only_where_they_hold():
    path = str(qwen_tokenizer_json() / "tokenizer.json")
    tokenizer = qwen2_5_tokenizer(path, bpe_cache_size=1000, errors="replace")
    assert tokenizer.encode("hi") == qwen2_5_tokenizer(path).encode("hi")
    with pytest.raises(ValueError, match="unk_token"):
        qwen2_5_tokenizer(path, unk_token="<unk>")
