"""Phi-4 tokenizer: GPT-style byte-level BPE (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) with Phi-4's
chat format ``<|im_start|>{role}<|im_sep|>{content}<|im_end|>``."""

import logging

from tune.data._chat_formats import Phi4ChatFormat, TorchtunePhi4Format, named_chat_format
from tune.data._tokenizers import (
    ChatTokenizer,
    HuggingFaceBaseTokenizer,
    PromptTemplate,
    byte_level_bpe_tokenizer,
    load_byte_level_bpe,
    read_json_file,
)

log = logging.getLogger(__name__)

# Phi-4's pre-tokenisation regex, OpenAI's cl100k_base split (torchtune's Phi-4 tokenizer uses it).
PHI4_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The text split of torchtune's Phi-4 tokenizer (its GPT-2 tokenizer's regex, without the (?i) and the Unicode
# classes of Phi-4's own): digits stay with letters ("abc123") and digit runs are not cut in threes. torchtune's
# layout uses it, so that torchtune's files give torchtune's tokens.
TORCHTUNE_PHI4_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\w]+| ?\d+| ?[^\s\w\d]+|\s+(?!\S)|\s+"""

# Phi-4's special tokens after the 100256 BPE entries (microsoft/phi-4, ids 100256-100351), named ones first; the
# other ids are <|dummy_N|> placeholders, numbered on from 4 in id order.
_NAMED = {
    100256: "<|dummy_0|>",
    100257: "<|endoftext|>",
    100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>",
    100260: "<|fim_suffix|>",
    100261: "<|dummy_1|>",
    100262: "<|dummy_2|>",
    100263: "<|dummy_3|>",
    100264: "<|im_start|>",
    100265: "<|im_end|>",
    100266: "<|im_sep|>",
    100276: "<|endofprompt|>",
}
_DUMMIES = [token_id for token_id in range(100267, 100352) if token_id not in _NAMED]
PHI4_SPECIAL_TOKENS: dict[str, int] = {
    **{token: token_id for token_id, token in _NAMED.items()},
    **{f"<|dummy_{index}|>": token_id for index, token_id in enumerate(_DUMMIES, start=4)},
}
# (content, special) in id order: the ids follow on from the BPE vocabulary in this order
PHI4_ADDED_TOKENS = [(token, True) for token, _ in sorted(PHI4_SPECIAL_TOKENS.items(), key=lambda item: item[1])]


def _text_tokenizer(
    vocab_path: str | None, merges_path: str | None, special_tokens_path: str | None, pattern: str = PHI4_PATTERN
) -> HuggingFaceBaseTokenizer:
    if vocab_path is None:
        raise ValueError(
            "phi4_tokenizer needs the model's tokenizer.json (path, or vocab_path), or its vocab.json (vocab_path) "
            "with merges.txt (merges_path)."
        )
    if merges_path is None:
        return load_byte_level_bpe(vocab_path, pattern=PHI4_PATTERN, added_tokens=PHI4_ADDED_TOKENS)
    added = PHI4_ADDED_TOKENS
    if special_tokens_path is not None:
        entries = read_json_file(special_tokens_path, "special_tokens_path").get("added_tokens", [])
        added = [(e["content"], bool(e.get("special", True))) for e in sorted(entries, key=lambda e: e["id"])]
    # no normaliser: Phi-4's tokenizer does not apply NFC
    tokenizer = byte_level_bpe_tokenizer(vocab_path, merges_path, pattern=pattern, added_tokens=added, nfc=False)
    return HuggingFaceBaseTokenizer.from_tokenizer(tokenizer)


class Phi4Tokenizer(ChatTokenizer):
    """The Phi-4 (14B) tokenizer (torchtune's class; :func:`phi4_tokenizer` returns one). With ``vocab.json`` +
    ``merges.txt`` (torchtune's files) text is split and conversations are laid out as torchtune does
    (:data:`TORCHTUNE_PHI4_PATTERN`, :class:`TorchtunePhi4Format`: message text with its trailing
    spaces removed, no ``<|im_end|>`` after an answer, every token carrying its message's mask);
    ``prompt_template: tune.data.Phi4ChatFormat`` selects the tokenizer and chat template of ``microsoft/phi-4``
    token for token, as tune's configs do. A ``tokenizer.json`` (which torchtune did not take) gets that chat
    template unless another is named.

    Args:
        merges_path (str | None): ``merges.txt``, with ``vocab_path`` a ``vocab.json``; None with a
            ``tokenizer.json``.
        vocab_path (str | None): ``vocab.json``, or ``tokenizer.json`` / its directory.
        special_tokens (dict[str, int] | None): accepted for torchtune's signature; the ids are read from the
            tokenizer (``special_tokens_path`` of :func:`phi4_tokenizer` chooses them for vocab/merges).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages (as in
            torchtune), or :class:`~tune.data.Phi4ChatFormat` (by dotted name, class or instance): that chat
            template instead of torchtune's layout.
        special_tokens_path (str | None): with vocab/merges, a tokenizer.json whose ``added_tokens`` are used.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: without ``vocab_path``, or if ``special_tokens`` disagree with the tokenizer's ids.
    """

    def __init__(
        self,
        merges_path: str | None = None,
        vocab_path: str | None = None,
        special_tokens: "dict[str, int] | None" = None,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = None,
        special_tokens_path: str | None = None,
    ) -> None:
        chat_format = named_chat_format(prompt_template, (Phi4ChatFormat,))
        if chat_format is not None:
            prompt_template = None
        elif merges_path is None:
            chat_format = Phi4ChatFormat()
        else:
            chat_format = TorchtunePhi4Format()
        torchtune_layout = isinstance(chat_format, TorchtunePhi4Format)
        pattern = TORCHTUNE_PHI4_PATTERN if torchtune_layout else PHI4_PATTERN
        text = _text_tokenizer(vocab_path, merges_path, special_tokens_path, pattern)
        found = {token: text.token_id(token) for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>")}
        found["<|dummy_85|>"] = text.token_id("<|dummy_85|>")
        if special_tokens is not None:
            wrong = {t: (i, text.token_id(t)) for t, i in special_tokens.items() if text.token_id(t) != i}
            if wrong:
                raise ValueError(f"special_tokens disagree with the tokenizer's ids (given, tokenizer's): {wrong}.")
        im_end, end_of_text = found["<|im_end|>"], found["<|endoftext|>"]
        super().__init__(
            text,
            chat_format,
            bos_id=end_of_text,  # torchtune's: prepended by encode(add_bos=True), never by the chat format
            eos_id=im_end,
            pad_id=found["<|dummy_85|>"],
            stop_tokens=[im_end, end_of_text],
            special_tokens=found,
            max_seq_len=max_seq_len,
            prompt_template=prompt_template,
        )


def phi4_tokenizer(
    vocab_path: str | None = None,
    merges_path: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
    path: str | None = None,
) -> Phi4Tokenizer:
    """The Phi-4 tokenizer: torchtune's text split and layout with ``vocab.json`` + ``merges.txt``, the tokenizer
    and chat template of ``microsoft/phi-4`` with ``prompt_template="tune.data.Phi4ChatFormat"`` or a
    ``tokenizer.json`` (see :class:`Phi4Tokenizer`).

    Args:
        vocab_path (str | None): ``vocab.json`` (with ``merges_path``; the special tokens get ids 100256-100351 in
            Phi-4's order), or the model's ``tokenizer.json`` / its directory (everything read from the file).
        merges_path (str | None): ``merges.txt``.
        special_tokens_path (str | None): with vocab/merges, a tokenizer.json whose ``added_tokens`` are used
            instead of Phi-4's built-in list.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): see :class:`Phi4Tokenizer`.
        path (str | None): the model's ``tokenizer.json`` (or its directory), in place of ``vocab_path``: the key
            tune's configs use for every family's tokenizer file. Default None.

    Returns:
        Phi4Tokenizer: BOS ``<|endoftext|>`` (plain ``encode`` only), EOS ``<|im_end|>``, pad ``<|dummy_85|>``,
        stop tokens ``[<|im_end|>, <|endoftext|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: without ``vocab_path`` or ``path``, or with both.
    """
    if path is not None:
        if vocab_path is not None or merges_path is not None:
            raise ValueError(
                f"phi4_tokenizer got path={path!r} and vocab_path={vocab_path!r}, merges_path={merges_path!r}; pass "
                "either the tokenizer.json as path, or vocab_path and merges_path."
            )
        vocab_path = path
    if special_tokens_path is not None and merges_path is None:
        log.warning("phi4_tokenizer: special_tokens_path has no effect with a tokenizer.json, which has its own.")
        special_tokens_path = None
    return Phi4Tokenizer(
        merges_path,
        vocab_path,
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
        special_tokens_path=special_tokens_path,
    )
