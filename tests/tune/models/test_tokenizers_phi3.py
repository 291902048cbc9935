"""phi3_mini_tokenizer: parity with transformers' apply_chat_template on the real Phi-3 template, exact masks, from
both a tokenizer.json and a SentencePiece tokenizer.model."""

import pytest

from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    hf_ids,
    phi3_tokenizer_dir,
    random_conversations,
    trained_runs,
)
from tune.data import Message, mask_messages
from tune.models.phi3._tokenizer import phi3_mini_tokenizer

transformers = pytest.importorskip("transformers")

# Chat template of microsoft/Phi-3-mini-4k-instruct (tokenizer_config.json), verbatim.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


@pytest.fixture(scope="module")
def reference():
    directory = phi3_tokenizer_dir()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"),
        bos_token="<s>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=PHI3_TEMPLATE,
    )


@pytest.fixture(scope="module", params=["tokenizer.json", "tokenizer.model"])
def ours(request):
    return phi3_mini_tokenizer(str(phi3_tokenizer_dir() / request.param))


def test_special_ids(ours):
    vocab = 480  # the tiny SentencePiece model; Phi-3's is 32000, so <|endoftext|> is 32000 and <|end|> 32007
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, vocab, vocab)
    assert ours.stop_tokens == [vocab + 7, vocab]
    assert ours.special_tokens["<|user|>"] == vocab + 10


@pytest.mark.parametrize("system", [True, False])
def test_chat_parity_and_exact_mask(ours, reference, system):
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    # <|user|>, <|end|>, ... strip the "\n" after them (rstrip), so the template's newlines leave no tokens
    assert tokens == hf_ids(reference, as_dicts(messages))
    runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
    answers = [m.text_content for m in messages if m.role == "assistant"]
    # the closing <|endoftext|> follows the last <|end|> and is trained with the last answer
    assert runs == [answers[0] + "<|end|>", answers[1] + "<|end|><|endoftext|>"]


def test_generation_prompt_parity(ours, reference):
    messages = mask_messages(conversation()[:-1])
    tokens, _ = ours.tokenize_messages(messages, add_end_tokens=False)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)


def test_tool_role_is_refused(ours):
    with pytest.raises(ValueError, match="phi3 chat format does not support"):
        ours.tokenize_messages([Message("user", "x"), Message("tool", "y")])


def test_parity_on_random_conversations(ours, reference):
    for messages in random_conversations(count=25, seed=1):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        runs = [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]
        # <|assistant|> swallows the whitespace after it (rstrip), so answers start at their first non-space
        answers = [m.text_content.lstrip() + "<|end|>" for m in messages if m.role == "assistant"]
        assert runs == answers[:-1] + [answers[-1] + "<|endoftext|>"]


def test_torchtune_class_takes_a_special_tokens_dict(ours):
    from tune.models.phi3 import Phi3MiniTokenizer

    tokenizer = Phi3MiniTokenizer(str(phi3_tokenizer_dir() / "tokenizer.model"), dict(ours.special_tokens))
    messages = mask_messages(conversation(system=True))
    assert isinstance(ours, Phi3MiniTokenizer)
    assert tokenizer.tokenize_messages(messages) == ours.tokenize_messages(messages)
