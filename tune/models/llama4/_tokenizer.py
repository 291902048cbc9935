"""Llama 4 tokenizer: the byte-level BPE of the release's ``tokenizer.json`` (o200k-style pre-tokenisation) with
Llama 4's chat format ``<|begin_of_text|><|header_start|>{role}<|header_end|>\\n\\n{content}<|eot|>``."""

from collections.abc import Sequence

from tune.data import Message, Segment
from tune.data._chat_formats import _Builder, _needs_generation_prompt, _open_end
from tune.data._tokenizers import ChatTokenizer, HuggingFaceBaseTokenizer, PromptTemplate

# The pre-tokenisation regex of Llama 4's tokenizer.json (OpenAI's o200k_base split: cased words with their
# contractions, numbers of up to three digits, punctuation runs, newlines, spaces). Read from the file when
# loading; kept here to build tokenizers of the same kind (tests).
LLAMA4_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The first special tokens of Llama 4, in id order after the 200000 BPE entries (meta-llama/Llama-4-Scout-17B-16E-
# Instruct tokenizer.json, ids 200000-200018; the release adds reserved and image tokens up to id 202047).
LLAMA4_SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|header_start|>", "<|header_end|>", "<|eom|>", "<|eot|>", "<|step|>",
    "<|text_post_train_reserved_special_token_0|>", "<|text_post_train_reserved_special_token_1|>",
    "<|text_post_train_reserved_special_token_2|>", "<|text_post_train_reserved_special_token_3|>",
    "<|text_post_train_reserved_special_token_4|>", "<|text_post_train_reserved_special_token_5|>",
    "<|python_start|>", "<|python_end|>", "<|finetune_right_pad|>",
)  # fmt: skip


class Llama4ChatFormat:
    """Llama 4: ``<|begin_of_text|><|header_start|>{role}<|header_end|>\\n\\n{content}<|eot|>`` per turn.

    Reproduces the text part of the chat template of ``meta-llama/Llama-4-Scout-17B-16E-Instruct``: the system
    prompt is stripped of surrounding whitespace, the other turns' content is kept as it is, every turn (the last
    assistant turn included) ends with ``<|eot|>``, and ``<|header_start|>assistant<|header_end|>\\n\\n`` is the
    generation prompt. Tool calls and results (the template's JSON tool layout) are not reproduced.
    """

    name = "llama4"
    roles = frozenset({"system", "user", "assistant"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        b.fixed("<|begin_of_text|>", special=True)
        for i, m in enumerate(messages):
            b.headers(i, _header(m.role))
            b.content(i, m._text.strip() if m.role == "system" else m._text)
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "<|eot|>", special=True)
        if _needs_generation_prompt(messages, add_end_tokens):
            for text, special in _header("assistant"):
                b.fixed(text, special)
        return b.segments


_HEADERS: dict[str, tuple[tuple[str, bool], ...]] = {}


def _header(role: str) -> tuple[tuple[str, bool], ...]:
    """``(text, special)`` pieces of a Llama 4 turn header (one tuple per role, reused)."""
    if role not in _HEADERS:
        _HEADERS[role] = (("<|header_start|>", True), (role, False), ("<|header_end|>", True), ("\n\n", False))
    return _HEADERS[role]


def llama4_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
) -> ChatTokenizer:
    """The Llama 4 tokenizer, read from the release's ``tokenizer.json``, with Llama 4's chat format.

    Args:
        path (str): ``tokenizer.json`` or its directory (``tune download meta-llama/Llama-4-Scout-17B-16E-Instruct``
            puts it in the model directory).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        ChatTokenizer: BOS ``<|begin_of_text|>``, EOS ``<|eot|>``, pad ``<|finetune_right_pad|>``, stop tokens
        ``[<|end_of_text|>, <|eom|>, <|eot|>]`` (the release's ``eos_token_id`` list).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if the file lacks one of Llama 4's chat tokens (it is then not a Llama 4 tokenizer).
    """
    text = HuggingFaceBaseTokenizer(path)
    names = ("<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eom|>", "<|eot|>")
    found = {name: text.token_id(name) for name in (*names, "<|finetune_right_pad|>")}
    return ChatTokenizer(
        text,
        Llama4ChatFormat(),
        bos_id=found["<|begin_of_text|>"],
        eos_id=found["<|eot|>"],
        pad_id=found["<|finetune_right_pad|>"],
        stop_tokens=[found["<|end_of_text|>"], found["<|eom|>"], found["<|eot|>"]],
        special_tokens=found,
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
    )
