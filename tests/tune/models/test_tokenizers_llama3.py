"""llama3_tokenizer: parity with transformers' apply_chat_template on the real Llama 3 template, exact masks."""

import pytest

from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    random_conversations,
    tiktoken_file,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.llama3._tokenizer import LLAMA3_PATTERN, llama3_special_tokens, llama3_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of meta-llama/Meta-Llama-3-8B-Instruct (tokenizer_config.json), verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def ours():
    return llama3_tokenizer(str(tiktoken_file()))


@pytest.fixture(scope="module")
def reference(ours):
    """transformers' own tiktoken conversion (the one that produced Llama 3's tokenizer.json) of the same file."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = sorted(ours.special_tokens, key=ours.special_tokens.get)
    converted = TikTokenConverter(
        vocab_file=str(tiktoken_file()), pattern=LLAMA3_PATTERN, extra_special_tokens=specials
    ).converted()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=converted,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA3_TEMPLATE,
    )


def test_special_token_ids_follow_the_ranks(ours):
    num_base = len(tiktoken_file().read_text().splitlines())
    # Llama 3 numbers its 256 special tokens after the 128000 ranks: 128000 BOS, 128001 EOS, 128009 <|eot_id|>
    assert ours.bos_id == num_base and ours.eos_id == num_base + 1
    assert ours.special_tokens["<|eot_id|>"] == num_base + 9
    assert ours.pad_id == ours.special_tokens["<|finetune_right_pad_id|>"] == num_base + 4
    assert ours.stop_tokens == [num_base + 1, num_base + 8, num_base + 9]
    assert llama3_special_tokens(128000)["<|reserved_special_token_247|>"] == 128255
    assert len(ours.special_tokens) == 256 and ours.vocab_size == num_base + 256


def test_encode_matches_transformers(ours, reference):
    text = "Hello world, café 12345 naïve!\n\n  spaces\tand tabs <|eot_id|>"
    # special-token strings in plain text are text, as transformers' split_special_tokens=True treats them
    expected = reference(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ours.encode(text, add_bos=False, add_eos=False) == expected
    assert ours.encode(text) == [ours.bos_id, *expected, ours.eos_id]
    assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(reference, as_dicts(messages))
    answers = [m.text_content.strip() for m in messages if m.role == "assistant"]
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
    assert runs == [a + "<|eot_id|>" for a in answers]


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(conversation()[:-1])
    tokens, mask = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert ours.decode(tokens, skip_special_tokens=False).endswith(header)
    # only the earlier answer is trained; the generation prompt is not
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
    assert runs == [messages[2].text_content + "<|eot_id|>"]


def test_tool_messages_use_the_ipython_header(ours):
    messages = [Message("user", "call it"), Message("assistant", "<|python_tag|>f()"), Message("tool", "42")]
    tokens, _ = ours.tokenize_messages(mask_messages(messages))
    text = ours.decode(tokens, skip_special_tokens=False)
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>" in text
    # special-token strings inside content are encoded as text, never as the special token
    assert ours.special_tokens["<|python_tag|>"] not in tokens


def test_tokenizer_json_gives_the_same_tokens(ours, reference, tmp_path):
    # Hugging Face Llama 3 repos ship tokenizer.json (converted as the reference is) beside original/tokenizer.model
    reference.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    from_json = llama3_tokenizer(str(tmp_path / "tokenizer.json"))
    messages = mask_messages(conversation())
    assert from_json.tokenize_messages(messages) == ours.tokenize_messages(messages)
    assert (from_json.bos_id, from_json.eos_id, from_json.pad_id) == (ours.bos_id, ours.eos_id, ours.pad_id)
    text = "plain text, 2024"
    assert from_json.encode(text) == ours.encode(text)


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=1):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        assert runs == [m.text_content.strip() + "<|eot_id|>" for m in messages if m.role == "assistant"]


def test_torchtune_class_takes_a_special_tokens_dict(ours):
    from tune.models.llama3 import Llama3Tokenizer

    special = dict(ours.special_tokens)
    tokenizer = Llama3Tokenizer(str(tiktoken_file()), special, None, None)
    messages = mask_messages(conversation(system=True))
    assert isinstance(ours, Llama3Tokenizer)
    assert tokenizer.tokenize_messages(messages) == ours.tokenize_messages(messages)
