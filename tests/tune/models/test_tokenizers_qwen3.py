"""qwen3_tokenizer: parity with transformers' apply_chat_template on the real Qwen 3 template, exact masks."""

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
from tune.models.qwen3._tokenizer import qwen3_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of Qwen/Qwen3-8B (tokenizer_config.json at its first release), verbatim.
QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
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
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


@pytest.fixture(scope="module")
def ours():
    return qwen3_tokenizer(str(qwen_tokenizer_json(qwen3=True)))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(qwen_tokenizer_json(qwen3=True) / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN3_TEMPLATE,
    )


def _runs(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


@pytest.mark.parametrize("system", [True, False])
def test_plain_multi_turn_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    # the template gives the final answer an empty think block; it is prompt-side (masked), the answer is trained
    text = ours.decode(tokens, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + messages[-1].text_content + "<|im_end|>\n")
    assert _runs(ours, tokens, mask) == [m.text_content + "<|im_end|>" for m in messages if m.role == "assistant"]


def test_reasoning_is_kept_after_the_last_query_and_dropped_before(ours, reference):
    messages = [
        Message("user", "What is 2 + 2?"),
        Message("assistant", "<think>\nsmall sum\n</think>\n\nIt is 4."),
        Message("user", "And 3 + 3?"),
        Message("assistant", "<think>\nanother sum\n</think>\n\nIt is 6."),
    ]
    mask_messages(messages)
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    # <think> and </think> are added tokens (single ids) in Qwen 3
    assert ours.tokenizer.token_id("<think>") in tokens
    assert _runs(ours, tokens, mask) == ["It is 4.<|im_end|>", "<think>\nanother sum\n</think>\n\nIt is 6.<|im_end|>"]


def test_generation_prompts_parity(ours, reference):
    messages = mask_messages(conversation()[:-1])
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    no_think = qwen3_tokenizer(str(qwen_tokenizer_json(qwen3=True)), enable_thinking=False)
    tokens, _ = no_think.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True, enable_thinking=False)


def test_tool_turns_parity(ours, reference):
    messages = [
        Message("system", "Use tools."),
        Message("user", "Weather?"),
        Message("assistant", "Calling."),
        Message("tool", "sunny"),
        Message("assistant", "It is sunny."),
    ]
    mask_messages(messages)
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert _runs(ours, tokens, mask)[-1] == "It is sunny.<|im_end|>"


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=1):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        answers = [m.text_content for m in messages if m.role == "assistant"]
        answers[-1] = answers[-1].lstrip("\n")  # the template strips newlines after the (empty) think block
        assert runs == [a + "<|im_end|>" for a in answers]
