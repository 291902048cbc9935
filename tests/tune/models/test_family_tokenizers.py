"""Every family's chat tokenizer against transformers' ``apply_chat_template`` on the release's chat template
(tests/tune/models/_chat_templates.py): the same tokens, exact loss masks, the special ids, plain encoding, the
registry entry and torchtune's tokenizer class. One row of ``FAMILIES`` per family says what differs; the shared
tests run over every row, and what only one family has (Qwen 3's think blocks, Llama 2's reference format, ...)
is tested below them. The tokenizers are the tiny ones of tests/tune/data/_tiny_tokenizers.py."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.recipes._family_assets import llama4_tokenizer_dir
from tests.tune.data._tiny_tokenizers import (
    as_dicts,
    conversation,
    gemma_sentencepiece_model,
    hf_ids,
    legacy_sentencepiece_reference,
    phi3_tokenizer_dir,
    qwen_tokenizer_json,
    random_conversations,
    sentencepiece_model,
    tiktoken_file,
    torchtune_no_template_reference,
    trained_runs,
)
from tests.tune.models._chat_templates import (
    GEMMA2_TEMPLATE,
    GEMMA3_TEMPLATE,
    LLAMA2_TEMPLATE,
    LLAMA3_TEMPLATE,
    LLAMA4_TEXT_TEMPLATE,
    MISTRAL_TEMPLATE,
    PHI3_TEMPLATE,
    QWEN2_5_TEMPLATE,
    QWEN3_TEMPLATE,
)
from tune.data import Llama2ChatFormat, Llama3ChatFormat, Message, MistralChatFormat, Phi3ChatFormat, mask_messages
from tune.models import gemma
from tune.models.gemma2 import GemmaTokenizer, gemma2_tokenizer, gemma_tokenizer
from tune.models.gemma3 import gemma3_tokenizer
from tune.models.llama2 import Llama2ChatTemplate, Llama2Tokenizer, llama2_tokenizer
from tune.models.llama3 import Llama3Tokenizer, llama3_special_tokens, llama3_tokenizer
from tune.models.llama3._tokenizer import LLAMA3_PATTERN
from tune.models.llama4 import llama4_tokenizer
from tune.models.mistral import MistralChatTemplate, MistralTokenizer, mistral_tokenizer
from tune.models.phi3 import Phi3MiniTokenizer, phi3_mini_tokenizer
from tune.models.qwen2_5 import qwen2_5_tokenizer
from tune.models.qwen3 import qwen3_tokenizer
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

# Plain text with the cases tokenizers get wrong: double spaces, accents, digits, newlines, a tab.
TEXT = "Hello world, café 12345 naïve!\n\n  spaces\tand tabs"


def _answers(suffix: str, trim: Callable[[str], str] = lambda text: text) -> Callable[[list[Message], bool], list[str]]:
    """Expected trained runs: each assistant message's content, trimmed as the template trims it, then ``suffix``."""
    return lambda messages, closed: [trim(m.text_content) + suffix for m in messages if m.role == "assistant"]


def _phi3_runs(messages: list[Message], closed: bool) -> list[str]:
    # <|assistant|> swallows the whitespace after it (rstrip), so an answer starts at its first non-space; the
    # closing <|endoftext|> follows the last <|end|> and is trained with the last answer
    runs = [m.text_content.lstrip() + "<|end|>" for m in messages if m.role == "assistant"]
    return runs[:-1] + [runs[-1] + "<|endoftext|>"] if closed else runs


def _qwen3_runs(messages: list[Message], closed: bool) -> list[str]:
    answers = [m.text_content for m in messages if m.role == "assistant"]
    if closed:  # the template strips newlines after the final answer's (empty) think block
        answers[-1] = answers[-1].lstrip("\n")
    return [a + "<|im_end|>" for a in answers]


def _llama3_ids(ours) -> tuple:
    # Llama 3 numbers its 256 special tokens after the 128000 ranks: 128000 BOS, 128001 EOS, 128004 pad
    # (<|finetune_right_pad_id|>), 128008 <|eom_id|>, 128009 <|eot_id|>
    n = len(tiktoken_file().read_text().splitlines())
    return n, n + 1, n + 4, [n + 1, n + 8, n + 9]


def _llama4_ids(ours) -> tuple:
    # the release's order: begin 200000, end 200001, eom 200007, eot 200008, finetune_right_pad 200018
    first = ours.tokenizer.token_id("<|begin_of_text|>")
    return first, first + 8, first + 18, [first + 1, first + 7, first + 8]


def _qwen_ids(ours) -> tuple:
    end_of_text = ours.special_tokens["<|endoftext|>"]
    return None, end_of_text, end_of_text, [ours.special_tokens["<|im_end|>"], end_of_text]


def _llama3_reference(template: str):
    """transformers' own tiktoken conversion (the one that produced Llama 3's tokenizer.json) of the same file."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    num_base = len(tiktoken_file().read_text().splitlines())
    specials = llama3_special_tokens(num_base)
    converted = TikTokenConverter(
        vocab_file=str(tiktoken_file()), pattern=LLAMA3_PATTERN, extra_special_tokens=sorted(specials, key=specials.get)
    ).converted()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=converted, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=template
    )


def _json_reference(path: Callable[[], Path], **tokens: str) -> Callable[[str], Any]:
    def build(template: str):
        return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path()), chat_template=template, **tokens)

    return build


def _sentencepiece_file() -> Path:
    return sentencepiece_model() / "tokenizer.model"


@dataclass(frozen=True)
class Family:
    """What one family's tokenizer tests need: how to build ours and the reference, and what to expect."""

    name: str  # the registry name
    builder: Callable[..., Any]
    files: dict[str, Callable[[], Path]]  # what the builder is given, by test id (Phi-3 reads two formats)
    reference: Callable[[str], Any]  # transformers' tokenizer of the same vocabulary, given a chat template
    template: str
    runs: Callable[[list[Message], bool], list[str]]  # the decoded trained runs of a (closed) conversation
    ids: Callable[[Any], tuple]  # (bos_id, eos_id, pad_id, stop_tokens) expected of our tokenizer
    random_seed: int = 1  # the seed of the 25 random conversations checked with and without a system prompt
    random_count: int = 25
    system_template: str | None = None  # the reference for a system prompt where the release's template rejects one
    encode_text: str = TEXT
    generation_suffix: str | None = None  # what the text ends with when a generation prompt is added
    tool_error: str | None = None  # the error a tool message raises where the format has no tool role
    torchtune_class: type | None = None  # torchtune's tokenizer class, which the builder returns
    torchtune: Callable[[Any], list[Any]] = field(default=lambda ours: [])  # the class built directly
    no_template_seed: int | None = None  # the seed of the prompt_template=None conversations


FAMILIES = [
    Family(
        # Gemma 2's template rejects a system prompt; gemma2_tokenizer folds one into the first user turn, as
        # Gemma 3's template does, so that template is the reference for a conversation with one.
        name="gemma2",
        builder=gemma2_tokenizer,
        files={"tokenizer.model": lambda: gemma_sentencepiece_model() / "tokenizer.model"},
        reference=lambda template: transformers.GemmaTokenizer.from_pretrained(
            str(gemma_sentencepiece_model()), chat_template=template
        ),
        template=GEMMA2_TEMPLATE,
        system_template=GEMMA3_TEMPLATE,
        runs=_answers("<end_of_turn>", str.strip),
        ids=lambda ours: (2, 1, 0, [1, ours.special_tokens["<end_of_turn>"]]),
        encode_text="Hello  world, café 42",
        generation_suffix="<end_of_turn>\n<start_of_turn>model\n",
        tool_error="gemma2 chat format does not support",
        torchtune_class=GemmaTokenizer,
        torchtune=lambda ours: [
            GemmaTokenizer(
                str(gemma_sentencepiece_model() / "tokenizer.model"), prompt_template="tune.data.Gemma2ChatFormat"
            )
        ],
    ),
    Family(
        name="gemma3",
        builder=gemma3_tokenizer,
        files={"tokenizer.model": lambda: gemma_sentencepiece_model() / "tokenizer.model"},
        reference=lambda template: transformers.GemmaTokenizer.from_pretrained(
            str(gemma_sentencepiece_model()), chat_template=template
        ),
        template=GEMMA3_TEMPLATE,
        runs=_answers("<end_of_turn>", str.strip),
        ids=lambda ours: (2, 1, 0, [1, ours.special_tokens["<end_of_turn>"]]),
        random_seed=3,
        random_count=15,
        generation_suffix="<end_of_turn>\n<start_of_turn>model\n",
        tool_error="chat format does not support",
    ),
    Family(
        name="llama2",
        # tune's Hugging Face-exact format; the default (torchtune's Llama2ChatTemplate) gives torchtune's tokens
        # (tests/recipes/test_torchtune_tokens.py)
        builder=functools.partial(llama2_tokenizer, prompt_template="tune.data.Llama2ChatFormat"),
        files={"tokenizer.model": _sentencepiece_file},
        reference=lambda template: legacy_sentencepiece_reference(sentencepiece_model(), template),
        template=LLAMA2_TEMPLATE,
        # trained: " {answer} </s>"; the leading space is inside the answer's first token ("▁The"), decoded away
        runs=_answers(" </s>", str.strip),
        ids=lambda ours: (1, 2, 0, [2]),
        encode_text="Hello world, café 12345 naïve!\n\n  spaces and ü",
        tool_error="role 'tool'",
        torchtune_class=Llama2Tokenizer,
        torchtune=lambda ours: [
            Llama2Tokenizer(str(_sentencepiece_file()), None, Llama2ChatFormat()),
            Llama2Tokenizer(str(_sentencepiece_file()), None, Llama2ChatFormat),
        ],
        no_template_seed=3,
    ),
    Family(
        name="llama3",
        # tune's Hugging Face-exact format; the default (torchtune's layout) gives torchtune's tokens
        # (tests/recipes/test_torchtune_tokens.py)
        builder=functools.partial(llama3_tokenizer, prompt_template="tune.data.Llama3ChatFormat"),
        files={"tokenizer.model": tiktoken_file},
        reference=_llama3_reference,
        template=LLAMA3_TEMPLATE,
        runs=_answers("<|eot_id|>", str.strip),
        ids=_llama3_ids,
        # special-token strings in plain text are text, as transformers' split_special_tokens=True treats them
        encode_text=TEXT + " <|eot_id|>",
        generation_suffix="<|start_header_id|>assistant<|end_header_id|>\n\n",
        torchtune_class=Llama3Tokenizer,
        torchtune=lambda ours: [
            Llama3Tokenizer(str(tiktoken_file()), dict(ours.special_tokens), None, Llama3ChatFormat())
        ],
    ),
    Family(
        # Llama 4's template trims only the system prompt
        name="llama4",
        builder=llama4_tokenizer,
        files={"tokenizer.json": lambda: llama4_tokenizer_dir() / "tokenizer.json"},
        reference=_json_reference(
            lambda: llama4_tokenizer_dir() / "tokenizer.json",
            bos_token="<|begin_of_text|>",
            eos_token="<|eot|>",
            pad_token="<|finetune_right_pad|>",
        ),
        template=LLAMA4_TEXT_TEMPLATE,
        runs=_answers("<|eot|>"),
        ids=_llama4_ids,
        random_seed=4,
        generation_suffix="<|eot|><|header_start|>assistant<|header_end|>\n\n",
        tool_error="role",
    ),
    Family(
        name="mistral",
        # tune's Hugging Face-exact format; the default (torchtune's MistralChatTemplate) gives torchtune's tokens
        # (tests/recipes/test_torchtune_tokens.py)
        builder=functools.partial(mistral_tokenizer, prompt_template="tune.data.MistralChatFormat"),
        files={"tokenizer.model": _sentencepiece_file},
        reference=lambda template: legacy_sentencepiece_reference(sentencepiece_model(), template),
        template=MISTRAL_TEMPLATE,
        # content is not stripped by this template; the template's " " before the answer is inside its first
        # token, and sentencepiece's decode drops one leading space (it reads it as the dummy prefix)
        runs=_answers("</s>", lambda text: text[1:] if text.startswith(" ") else text),
        ids=lambda ours: (1, 2, 0, [2]),
        tool_error="mistral chat format does not support",
        torchtune_class=MistralTokenizer,
        torchtune=lambda ours: [MistralTokenizer(str(_sentencepiece_file()), prompt_template=MistralChatFormat())],
        no_template_seed=4,
    ),
    Family(
        # <|user|>, <|end|>, ... strip the "\n" after them (rstrip), so the template's newlines leave no tokens.
        # tune's Hugging Face-exact format; the default with a tokenizer.model (torchtune's layout) gives
        # torchtune's tokens (tests/recipes/test_torchtune_tokens.py)
        name="phi3",
        builder=functools.partial(phi3_mini_tokenizer, prompt_template="tune.data.Phi3ChatFormat"),
        files={
            "tokenizer.json": lambda: phi3_tokenizer_dir() / "tokenizer.json",
            "tokenizer.model": lambda: phi3_tokenizer_dir() / "tokenizer.model",
        },
        reference=_json_reference(
            lambda: phi3_tokenizer_dir() / "tokenizer.json",
            bos_token="<s>",
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
        ),
        template=PHI3_TEMPLATE,
        runs=_phi3_runs,
        # the tiny SentencePiece model has 480 pieces; Phi-3's has 32000, so <|endoftext|> is 32000, <|end|> 32007
        ids=lambda ours: (1, 480, 480, [480 + 7, 480]),
        tool_error="phi3 chat format does not support",
        torchtune_class=Phi3MiniTokenizer,
        torchtune=lambda ours: [
            Phi3MiniTokenizer(
                str(phi3_tokenizer_dir() / "tokenizer.model"),
                dict(ours.special_tokens),
                prompt_template=Phi3ChatFormat(),
            )
        ],
    ),
    Family(
        # without a system message the template inserts its default system prompt; so do we (never trained)
        name="qwen2_5",
        builder=qwen2_5_tokenizer,
        files={"tokenizer.json": lambda: qwen_tokenizer_json() / "tokenizer.json"},
        reference=_json_reference(
            lambda: qwen_tokenizer_json() / "tokenizer.json", eos_token="<|im_end|>", pad_token="<|endoftext|>"
        ),
        template=QWEN2_5_TEMPLATE,
        runs=_answers("<|im_end|>"),
        ids=_qwen_ids,
        encode_text="Ünïcode text, 123 <|im_end|> end",
        generation_suffix="<|im_start|>assistant\n",
    ),
    Family(
        name="qwen3",
        builder=qwen3_tokenizer,
        files={"directory": lambda: qwen_tokenizer_json(qwen3=True)},  # the builder finds tokenizer.json in it
        reference=_json_reference(
            lambda: qwen_tokenizer_json(qwen3=True) / "tokenizer.json",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
        ),
        template=QWEN3_TEMPLATE,
        runs=_qwen3_runs,
        ids=_qwen_ids,
        generation_suffix="<|im_start|>assistant\n",
    ),
]
BY_NAME = {family.name: family for family in FAMILIES}


def _cases(having: str | None = None) -> list:
    """One case per family and file it reads, limited to the families where ``having`` is set."""
    return [
        pytest.param(family, name, id=family.name if len(family.files) == 1 else f"{family.name}-{name}")
        for family in FAMILIES
        if having is None or getattr(family, having) is not None
        for name in family.files
    ]


@functools.cache
def _ours(family_name: str, file: str | None = None):
    family = BY_NAME[family_name]
    return family.builder(str(family.files[file or next(iter(family.files))]()))


@functools.cache
def _reference(family_name: str, template: str):
    return BY_NAME[family_name].reference(template)


def _template(family: Family, system: bool) -> str:
    return family.system_template if system and family.system_template else family.template


def _runs(ours, tokens: list[int], mask: list[bool]) -> list[str]:
    """The trained runs of a tokenized conversation, decoded."""
    return [ours.decode(run, skip_special_tokens=False) for run in trained_runs(tokens, mask)]


# ---- every family ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, file", _cases())
def test_registry_entry_and_special_ids(family, file):
    ours = _ours(family.name, file)
    assert get_model_family(family.name).tokenizer is getattr(family.builder, "func", family.builder)
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.stop_tokens) == family.ids(ours)


@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("family, file", _cases())
def test_chat_parity_and_exact_mask(family, file, system):
    ours = _ours(family.name, file)
    messages = mask_messages(conversation(system=system))
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(_reference(family.name, _template(family, system)), as_dicts(messages))
    assert _runs(ours, tokens, mask) == family.runs(messages, True)


@pytest.mark.parametrize("system", [True, False])
@pytest.mark.parametrize("family, file", _cases())
def test_generation_prompt_parity(family, file, system):
    # a conversation that ends with a user turn: only the earlier answer is trained, the generation prompt is not
    ours = _ours(family.name, file)
    messages = mask_messages(conversation(system=system)[:-1])
    tokens, mask = ours.tokenize_messages(messages, add_end_tokens=False)
    reference = _reference(family.name, _template(family, system))
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True)
    assert _runs(ours, tokens, mask) == family.runs(messages, False)
    if family.generation_suffix is not None:
        assert ours.decode(tokens, skip_special_tokens=False).endswith(family.generation_suffix)


@pytest.mark.parametrize("system", [False, True])
@pytest.mark.parametrize("family, file", _cases())
def test_parity_on_random_conversations(family, file, system):
    # leading, trailing and inner whitespace runs, tabs, accents and an emoji in every role's content
    ours = _ours(family.name, file)
    reference = _reference(family.name, _template(family, system))
    for messages in random_conversations(count=family.random_count, seed=family.random_seed, system=system):
        tokens, mask = ours.tokenize_messages(mask_messages(messages))
        assert tokens == hf_ids(reference, as_dicts(messages)), as_dicts(messages)
        assert _runs(ours, tokens, mask) == family.runs(messages, True), as_dicts(messages)


@pytest.mark.parametrize("family, file", _cases())
def test_encode_matches_transformers(family, file):
    ours = _ours(family.name, file)
    text = family.encode_text
    reference = _reference(family.name, family.template)
    expected = reference(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    bos = [] if ours.bos_id is None else [ours.bos_id]
    assert ours.encode(text, add_bos=False, add_eos=False) == expected
    assert ours.encode(text, add_eos=False) == [*bos, *expected]
    assert ours.encode(text) == [*bos, *expected, ours.eos_id]
    assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("family, file", _cases("tool_error"))
def test_tool_role_is_refused(family, file):
    with pytest.raises(ValueError, match=family.tool_error):
        _ours(family.name, file).tokenize_messages([Message("user", "x"), Message("tool", "y")])


@pytest.mark.parametrize("family, file", _cases("torchtune_class"))
def test_torchtune_class_gives_the_builders_tokens(family, file):
    ours = _ours(family.name, file)
    assert isinstance(ours, family.torchtune_class)
    messages = mask_messages(conversation(system=True))
    for tokenizer in family.torchtune(ours):
        assert tokenizer.tokenize_messages(messages) == ours.tokenize_messages(messages)
        assert tokenizer.encode(TEXT) == ours.encode(TEXT)


# ---- Llama 2 and Mistral: torchtune's prompt_template argument ---------------------------------------------------


@pytest.mark.parametrize("family, file", _cases("no_template_seed"))
def test_no_template_matches_torchtune_rule(family, file):
    # prompt_template=None: torchtune lays messages out without [INST] tags (the rule is spelled out in
    # torchtune_no_template_reference, which encodes with sentencepiece directly)
    path = family.files[file]()
    tokenizer = family.builder(str(path), prompt_template=None)
    strategies = ["train_on_assistant", "train_on_all", "train_on_last"]
    for i, messages in enumerate(random_conversations(count=30, seed=family.no_template_seed)):
        messages = mask_messages(messages, strategies[i % 3])
        assert tokenizer.tokenize_messages(messages) == torchtune_no_template_reference(path, messages)


# ---- Gemma 2 and Gemma 3 -----------------------------------------------------------------------------------------


def test_gemma2_template_rejects_the_system_prompt_gemma3s_folds():
    messages = mask_messages(conversation(system=True))
    with pytest.raises(Exception, match="System role not supported"):  # why Gemma 3's template is the reference
        hf_ids(_reference("gemma2", GEMMA2_TEMPLATE), as_dicts(messages))
    for name in ["gemma2", "gemma3"]:  # the system text opens the first user turn, followed by a blank line
        ours = _ours(name)
        text = ours.decode(ours.tokenize_messages(messages)[0], skip_special_tokens=False)
        assert f"<start_of_turn>user\n{messages[0].text_content}\n\n" in text


def test_gemma2_package_keeps_torchtunes_names():
    assert gemma_tokenizer is gemma.gemma_tokenizer  # torchtune's gemma2 package re-exports Gemma's builder
    tokenizer = GemmaTokenizer(str(gemma_sentencepiece_model() / "tokenizer.model"), 16)
    assert tokenizer.max_seq_len == 16
    assert tokenizer.encode("hello world") == _ours("gemma2").encode("hello world")


# ---- Llama 2 -----------------------------------------------------------------------------------------------------


def test_llama2_system_must_come_first():
    messages = [Message("user", "hi"), Message("system", "late"), Message("assistant", "ok")]
    with pytest.raises(ValueError, match="message 1 is a system message"):
        _ours("llama2").tokenize_messages(messages)


def test_llama2_no_template_continuation_has_no_dummy_prefix():
    # the answer after "### Response:\n" is encoded as mid-text: "Yes" without the "▁" a fresh encode would add
    tok = llama2_tokenizer(str(_sentencepiece_file()), prompt_template=None)
    tokens, mask = tok.tokenize_messages([Message("user", "Question:\n", masked=True), Message("assistant", "Yes")])
    answer = tokens[len(tok.encode("Question:\n", add_eos=False)) : -1]
    assert answer == tok.tokenizer.encode("Yes", add_bos=False, add_eos=False, trim_leading_whitespace=True)
    assert answer != tok.encode("Yes", add_bos=False, add_eos=False) and "[INST]" not in tok.decode(tokens)
    assert mask == [True] * (len(tokens) - len(answer) - 1) + [False] * (len(answer) + 1)


def shout(messages):
    return [Message(m.role, m.text_content.upper(), masked=m.masked) for m in messages]


def test_llama2_other_templates_are_applied_then_laid_out_without_chat_format():
    path = _sentencepiece_file()
    messages = mask_messages(conversation(system=False))
    for template in [shout, "tests.tune.models.test_family_tokenizers.shout"]:
        tokens = llama2_tokenizer(str(path), prompt_template=template).tokenize_messages(messages)
        assert tokens == torchtune_no_template_reference(path, shout(messages))


def meta_llama2_chat_reference(model_path, messages: list[dict]) -> list[int]:
    """Ids of Meta's reference Llama 2 chat format, re-derived from ``sentencepiece`` alone following
    ``chat_completion`` in github.com/meta-llama/llama (llama/generation.py): the system prompt is folded into the
    first user turn as ``"<<SYS>>\\n" + system + "\\n<</SYS>>\\n\\n" + user``; each user/answer pair is one
    ``sp.encode(f"[INST] {user.strip()} [/INST] {answer.strip()} ")`` between BOS and EOS (so the text ends in a
    space, which SentencePiece encodes as a "▁" token before EOS); a final user turn is
    ``[INST] {user.strip()} [/INST]`` after BOS."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    if messages[0]["role"] == "system":
        merged = "<<SYS>>\n" + messages[0]["content"] + "\n<</SYS>>\n\n" + messages[1]["content"]
        messages = [{"role": messages[1]["role"], "content": merged}, *messages[2:]]
    ids = []
    for prompt, answer in zip(messages[::2], messages[1::2]):
        text = f"[INST] {prompt['content'].strip()} [/INST] {answer['content'].strip()} "
        ids += [sp.bos_id(), *sp.encode(text), sp.eos_id()]
    if len(messages) % 2:
        ids += [sp.bos_id(), *sp.encode(f"[INST] {messages[-1]['content'].strip()} [/INST]")]
    return ids


@pytest.mark.parametrize("system", [True, False])
def test_llama2_chat_format_matches_meta_reference(system):
    # An Alpaca sample with the Llama 2 template: the prompt ends in "### Response:\n". Meta's format (and the HF
    # chat template, checked against transformers above) strips it and ends each answer with " </s>" (a "▁" token
    # before EOS). torchtune 0.6.1's Llama2ChatTemplate keeps the "\n" before " [/INST]" (with the benchmark's
    # tokenizer "<0x0A>", "▁", "▁", "<0x5B>" where the reference has "▁", "<0x5B>") and drops the "▁" before EOS:
    # one token more per Alpaca sample (benchmarks/bench_data.py, 50,000 samples: 7,396,125 tokens against
    # 7,346,125 for tune and this reference). tune follows the reference.
    ours, path = _ours("llama2"), _sentencepiece_file()
    reference = _reference("llama2", LLAMA2_TEMPLATE)
    prompt = "Below is an instruction.\n\n### Instruction:\nName the capital of France.\n\n### Response:\n"
    messages = [Message("user", prompt), Message("assistant", "The capital of France is Paris.")]
    if system:
        messages.insert(0, Message("system", "You are a helpful assistant."))
    for dialog in [messages, mask_messages(conversation(system=system))]:
        tokens, _ = ours.tokenize_messages(dialog)
        assert tokens == meta_llama2_chat_reference(path, as_dicts(dialog))
        assert tokens == hf_ids(reference, as_dicts(dialog))
    # a final user turn, open for generation
    tokens, _ = ours.tokenize_messages(messages[:-1], add_end_tokens=False)
    assert tokens == meta_llama2_chat_reference(path, as_dicts(messages[:-1]))
    for dialog in random_conversations(count=25, seed=4):
        assert ours.tokenize_messages(dialog)[0] == meta_llama2_chat_reference(path, as_dicts(dialog))


def test_llama2_chat_template_called_on_messages_writes_torchtunes_parts():
    messages = [Message("system", "S"), Message("user", "U1"), Message("assistant", "A1"), Message("user", "U2")]
    out = Llama2ChatTemplate()(messages)
    # torchtune 0.6.1's layout: the tags as parts of their own, the system prompt in every user turn after it
    system = ["<<SYS>>\n", "S", "\n<</SYS>>\n\n"]
    assert [(m.role, [p["content"] for p in m.content]) for m in out] == [
        ("user", ["[INST] ", *system, "U1", " [/INST] "]),
        ("assistant", ["A1"]),
        ("user", ["[INST] ", *system, "U2", " [/INST] "]),
    ]


# ---- Llama 3 -----------------------------------------------------------------------------------------------------


def test_llama3_special_tokens_follow_the_ranks():
    ours = _ours("llama3")
    num_base = len(tiktoken_file().read_text().splitlines())
    assert ours.special_tokens["<|eot_id|>"] == num_base + 9
    assert ours.pad_id == ours.special_tokens["<|finetune_right_pad_id|>"]
    assert llama3_special_tokens(128000)["<|reserved_special_token_247|>"] == 128255
    assert len(ours.special_tokens) == 256 and ours.vocab_size == num_base + 256


def test_llama3_tool_messages_use_the_ipython_header():
    ours = _ours("llama3")
    messages = [Message("user", "call it"), Message("assistant", "<|python_tag|>f()"), Message("tool", "42")]
    tokens, _ = ours.tokenize_messages(mask_messages(messages))
    text = ours.decode(tokens, skip_special_tokens=False)
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>" in text
    # special-token strings inside content are encoded as text, never as the special token
    assert ours.special_tokens["<|python_tag|>"] not in tokens


def test_llama3_tokenizer_json_gives_the_same_tokens(tmp_path):
    # Hugging Face Llama 3 repos ship tokenizer.json (converted as the reference is) beside original/tokenizer.model
    ours = _ours("llama3")
    _reference("llama3", LLAMA3_TEMPLATE).backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    from_json = llama3_tokenizer(str(tmp_path / "tokenizer.json"))
    messages = mask_messages(conversation())
    # with a tokenizer.json (a path torchtune did not take) the default is the Hugging Face-exact format
    assert from_json.tokenize_messages(messages) == ours.tokenize_messages(messages)
    assert (from_json.bos_id, from_json.eos_id, from_json.pad_id) == (ours.bos_id, ours.eos_id, ours.pad_id)
    text = "plain text, 2024"
    assert from_json.encode(text) == ours.encode(text)


# ---- Llama 4 -----------------------------------------------------------------------------------------------------


def test_llama4_special_ids_by_name():
    ours = _ours("llama4")
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|eom|>", "<|eot|>"]
    first = ours.tokenizer.token_id("<|begin_of_text|>")
    ids = {name: ours.tokenizer.token_id(name) for name in specials}
    # the release's order: begin 200000, end 200001, header_start 200005, eom 200007, eot 200008
    assert ids == {name: first + offset for name, offset in zip(specials, (0, 1, 5, 7, 8), strict=True)}
    assert (ours.bos_id, ours.eos_id) == (ids["<|begin_of_text|>"], ids["<|eot|>"])
    assert ours.pad_id == ours.tokenizer.token_id("<|finetune_right_pad|>")
    assert ours.stop_tokens == [ids["<|end_of_text|>"], ids["<|eom|>"], ids["<|eot|>"]]
    with pytest.raises(ValueError, match="role"):
        ours.tokenize_messages([Message("tool", "4")])


# ---- Mistral -----------------------------------------------------------------------------------------------------


def test_mistral_train_on_all_trains_everything_after_bos():
    ours = _ours("mistral")
    tokens, mask = ours.tokenize_messages(mask_messages(conversation(), "all"))
    assert tokens[0] == ours.bos_id
    assert mask == [True] + [False] * (len(tokens) - 1)


def test_mistral_train_on_last_trains_only_the_last_answer():
    ours = _ours("mistral")
    messages = mask_messages(conversation(), "last")
    tokens, mask = ours.tokenize_messages(messages)
    assert _runs(ours, tokens, mask) == [messages[-1].text_content + "</s>"]


def test_mistral_roles_and_empty_content_errors():
    ours = _ours("mistral")
    with pytest.raises(ValueError, match="a user message must follow the system message"):
        ours.tokenize_messages([Message("system", "s"), Message("assistant", "a")])
    with pytest.raises(ValueError, match=r"message 1 \(assistant\) has empty content"):
        ours.tokenize_messages([Message("user", "q"), Message("assistant", "  ")])


def test_mistral_chat_template_is_torchtunes():
    # torchtune 0.6.1's template: tags as parts of their own; a system message is refused (tune's
    # MistralChatFormat folds it into the first user turn instead)
    out = MistralChatTemplate()([Message("user", "U"), Message("assistant", "A")])
    assert [[p["content"] for p in m.content] for m in out] == [["[INST] ", "U", " [/INST] "], ["", "A", ""]]
    with pytest.raises(ValueError, match="does not take a system message.*tune.data.MistralChatFormat"):
        MistralChatTemplate()([Message("system", "S"), Message("user", "U")])


# ---- Phi-3 -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("file", ["tokenizer.json", "tokenizer.model"])
def test_phi3_role_tokens_follow_the_vocabulary(file):
    assert _ours("phi3", file).special_tokens["<|user|>"] == 480 + 10


# ---- Qwen 2.5 ----------------------------------------------------------------------------------------------------


def test_qwen2_5_inserts_the_default_system_prompt():
    ours = _ours("qwen2_5")
    tokens, _ = ours.tokenize_messages(mask_messages(conversation(system=False)))
    assert "You are Qwen, created by Alibaba Cloud." in ours.decode(tokens)


def test_qwen2_5_tool_turns_and_generation_prompt_parity():
    ours = _ours("qwen2_5")
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
    assert tokens == hf_ids(_reference("qwen2_5", QWEN2_5_TEMPLATE), as_dicts(messages), add_generation_prompt=True)
    assert _runs(ours, tokens, mask) == ["Let me call the tool.<|im_end|>", "It is 4.<|im_end|>"]


def test_qwen2_5_vocab_and_merges_route():
    # torchtune's arguments (vocab.json + merges.txt) build the same tokenizer as the tokenizer.json (with the same
    # chat format named: torchtune's files alone give torchtune's layout, tests/recipes/test_torchtune_tokens.py)
    ours = _ours("qwen2_5")
    directory = qwen_tokenizer_json()
    from_files = qwen2_5_tokenizer(
        str(directory / "vocab.json"),
        merges_file=str(directory / "merges.txt"),
        prompt_template="tune.data.Qwen2_5ChatFormat",
    )
    messages = mask_messages(conversation())
    assert from_files.tokenize_messages(messages) == ours.tokenize_messages(messages)
    assert from_files.special_tokens == ours.special_tokens
    with pytest.raises(ValueError, match="merges_file"):
        qwen2_5_tokenizer(str(directory / "vocab.json"))


def test_qwen2_5_torchtune_keyword_options_accepted_only_where_they_hold():
    path = str(qwen_tokenizer_json() / "tokenizer.json")
    tokenizer = qwen2_5_tokenizer(path, bpe_cache_size=1000, errors="replace")
    assert tokenizer.encode("hi") == qwen2_5_tokenizer(path).encode("hi")
    with pytest.raises(ValueError, match="unk_token"):
        qwen2_5_tokenizer(path, unk_token="<unk>")


# ---- Qwen 3 ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("system", [True, False])
def test_qwen3_final_answer_gets_an_empty_think_block(system):
    # the template gives the final answer an empty think block; it is prompt-side (masked), the answer is trained
    ours = _ours("qwen3")
    messages = mask_messages(conversation(system=system))
    text = ours.decode(ours.tokenize_messages(messages)[0], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + messages[-1].text_content + "<|im_end|>\n")


def test_qwen3_reasoning_is_kept_after_the_last_query_and_dropped_before():
    ours = _ours("qwen3")
    messages = [
        Message("user", "What is 2 + 2?"),
        Message("assistant", "<think>\nsmall sum\n</think>\n\nIt is 4."),
        Message("user", "And 3 + 3?"),
        Message("assistant", "<think>\nanother sum\n</think>\n\nIt is 6."),
    ]
    mask_messages(messages)
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(_reference("qwen3", QWEN3_TEMPLATE), as_dicts(messages))
    # <think> and </think> are added tokens (single ids) in Qwen 3
    assert ours.tokenizer.token_id("<think>") in tokens
    assert _runs(ours, tokens, mask) == ["It is 4.<|im_end|>", "<think>\nanother sum\n</think>\n\nIt is 6.<|im_end|>"]


def test_qwen3_generation_prompt_without_thinking():
    messages = mask_messages(conversation()[:-1])
    no_think = qwen3_tokenizer(str(qwen_tokenizer_json(qwen3=True)), enable_thinking=False)
    tokens, _ = no_think.tokenize_messages(messages, add_end_tokens=False)
    reference = _reference("qwen3", QWEN3_TEMPLATE)
    assert tokens == hf_ids(reference, as_dicts(messages), add_generation_prompt=True, enable_thinking=False)


def test_qwen3_tool_turns_parity():
    ours = _ours("qwen3")
    messages = [
        Message("system", "Use tools."),
        Message("user", "Weather?"),
        Message("assistant", "Calling."),
        Message("tool", "sunny"),
        Message("assistant", "It is sunny."),
    ]
    mask_messages(messages)
    tokens, mask = ours.tokenize_messages(messages)
    assert tokens == hf_ids(_reference("qwen3", QWEN3_TEMPLATE), as_dicts(messages))
    assert _runs(ours, tokens, mask)[-1] == "It is sunny.<|im_end|>"
