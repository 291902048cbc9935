"""llama4_tokenizer: parity with transformers' apply_chat_template on Llama 4's chat template (its text part), exact
masks, and the special ids, on a tiny Llama-4-style tokenizer.json built in code."""

import pytest

from tests.recipes._family_assets import llama4_tokenizer_dir
from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    random_conversations,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.llama4 import llama4_tokenizer
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

# The text-only part of the chat template of meta-llama/Llama-4-Scout-17B-16E-Instruct, transcribed: BOS, the
# system prompt trimmed in its own turn, every other turn's content as it is, <|eot|> after every turn, and the
# assistant header as the generation prompt (the tool and image branches left out).
LLAMA4_TEXT_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|header_start|>system<|header_end|>\\n\\n' + messages[0]['content'] | trim + '<|eot|>' }}
    {%- set messages = messages[1:] %}
{%- endif %}
{%- for message in messages %}
    {{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' + message['content'] + '<|eot|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|header_start|>assistant<|header_end|>\\n\\n' }}
{%- endif %}
"""


@pytest.fixture(scope="module")
def ours():
    return llama4_tokenizer(str(llama4_tokenizer_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(llama4_tokenizer_dir() / "tokenizer.json"),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot|>",
        pad_token="<|finetune_right_pad|>",
        chat_template=LLAMA4_TEXT_TEMPLATE,
    )


def _runs(ours, tokens, mask):
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    assert _runs(ours, tokens, mask) == [m.text_content + "<|eot|>" for m in messages if m.role == "assistant"]


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(conversation()[:-1])  # ends with a user turn
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    assert ours.decode(tokens, skip_special_tokens=False).endswith("<|eot|><|header_start|>assistant<|header_end|>\n\n")


def test_parity_on_random_conversations(ours, reference):
    # whitespace around and inside the content: only the system prompt is trimmed
    for messages in random_conversations(count=25, seed=4):
        tokens, _ = ours.tokenize_messages(messages)
        assert tokens == hf_ids(reference, as_dicts(messages)), [m.text_content for m in messages]


def test_special_ids_and_family_registration(ours):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|eom|>", "<|eot|>"]
    first = ours.tokenizer.token_id("<|begin_of_text|>")
    ids = {name: ours.tokenizer.token_id(name) for name in specials}
    # the release's order: begin 200000, end 200001, header_start 200005, eom 200007, eot 200008
    assert ids == {name: first + offset for name, offset in zip(specials, (0, 1, 5, 7, 8), strict=True)}
    assert (ours.bos_id, ours.eos_id) == (ids["<|begin_of_text|>"], ids["<|eot|>"])
    assert ours.pad_id == ours.tokenizer.token_id("<|finetune_right_pad|>") == first + 18
    assert ours.stop_tokens == [ids["<|end_of_text|>"], ids["<|eom|>"], ids["<|eot|>"]]
    assert get_model_family("llama4").tokenizer is llama4_tokenizer
    with pytest.raises(ValueError, match="role"):
        ours.tokenize_messages([Message("tool", "4")])
