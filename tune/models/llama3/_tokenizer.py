"""Llama 3 tokenizer (used by Llama 3, 3.1, 3.2 and 3.3): tiktoken BPE ``tokenizer.model`` with header tokens."""

from pathlib import Path

from tune.data._chat_formats import Llama3ChatFormat, TorchtuneLlama3Format
from tune.data._tokenizers import (
    ChatTokenizer,
    HuggingFaceBaseTokenizer,
    PromptTemplate,
    TikTokenBaseTokenizer,
    TokenizerFileError,
    TokenizerFileNotFoundError,
    load_tiktoken_ranks,
    read_json_file,
    select_chat_format,
)

# Llama 3's pre-tokenisation regex (from Meta's reference tokenizer): contractions, letters with an optional
# leading non-letter, 1-3 digit groups, punctuation runs, newlines, other whitespace.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# Llama 3 has 256 special tokens after the 128000 BPE ranks; these are their offsets from the first one.
_NAMED_SPECIAL_OFFSETS = {
    "<|begin_of_text|>": 0,
    "<|end_of_text|>": 1,
    "<|reserved_special_token_0|>": 2,
    "<|reserved_special_token_1|>": 3,
    "<|finetune_right_pad_id|>": 4,
    "<|reserved_special_token_2|>": 5,
    "<|start_header_id|>": 6,
    "<|end_header_id|>": 7,
    "<|eom_id|>": 8,
    "<|eot_id|>": 9,
    "<|python_tag|>": 10,
}
NUM_LLAMA3_SPECIAL_TOKENS = 256


def llama3_special_tokens(num_base_tokens: int) -> dict[str, int]:
    """Llama 3's special tokens, numbered after ``num_base_tokens`` BPE ranks (128000 for the real model).

    Offsets 11..255 are ``<|reserved_special_token_3|>`` .. ``<|reserved_special_token_247|>``.
    """
    tokens = {name: num_base_tokens + offset for name, offset in _NAMED_SPECIAL_OFFSETS.items()}
    for offset in range(len(_NAMED_SPECIAL_OFFSETS), NUM_LLAMA3_SPECIAL_TOKENS):
        tokens[f"<|reserved_special_token_{offset - 8}|>"] = num_base_tokens + offset
    return tokens


def _read_special_tokens(path: str) -> dict[str, int]:
    """``added_tokens`` of a Hugging Face tokenizer.json as {content: id}."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise TokenizerFileNotFoundError(
            f"special_tokens_path {str(file)!r} not found; pass the model's tokenizer.json."
        )
    added = read_json_file(file, "special_tokens_path").get("added_tokens")
    if not isinstance(added, list):
        raise TokenizerFileError(f"{file} has no 'added_tokens' list; pass the model's Hugging Face tokenizer.json.")
    return {entry["content"]: int(entry["id"]) for entry in added}


def _text_tokenizer(
    path: str, special_tokens: "dict[str, int] | None"
) -> "tuple[TikTokenBaseTokenizer | HuggingFaceBaseTokenizer, dict[str, int]]":
    """The text tokenizer for ``path`` (tiktoken file, or tokenizer.json) and its special tokens."""
    file = Path(path).expanduser()
    if file.is_dir() or file.suffix == ".json":
        text = HuggingFaceBaseTokenizer(file)
        return text, {token: text.token_id(token) for token in _NAMED_SPECIAL_OFFSETS}
    ranks = load_tiktoken_ranks(path)
    special = dict(special_tokens) if special_tokens else llama3_special_tokens(len(ranks))
    text = TikTokenBaseTokenizer(
        path,
        name="llama3",
        pattern=LLAMA3_PATTERN,
        bos_id=special["<|begin_of_text|>"],
        eos_id=special["<|end_of_text|>"],
        special_tokens=special,
        ranks=ranks,
    )
    return text, special


# tune's name for the Hugging Face-exact Llama 3 chat format, as ``prompt_template``
LLAMA3_CHAT_FORMAT = "tune.data.Llama3ChatFormat"


def _chat_format_name(prompt_template: object) -> object:
    """:class:`~tune.data.Llama3ChatFormat` given as the class or an instance, by its dotted name (other values
    unchanged)."""
    if prompt_template is Llama3ChatFormat or isinstance(prompt_template, Llama3ChatFormat):
        return LLAMA3_CHAT_FORMAT
    return prompt_template


class Llama3Tokenizer(ChatTokenizer):
    """The Llama 3 tokenizer (torchtune's class; :func:`llama3_tokenizer` returns one).

    Args:
        path (str): ``tokenizer.model`` (tiktoken BPE file; ``original/tokenizer.model`` in Hugging Face repos),
            or the repository's ``tokenizer.json`` (or its directory), which encodes the same way.
        special_tokens (dict[str, int] | None): special token -> id, replacing the built-in ones (with a
            ``tokenizer.model``). Default None: Llama 3's.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune, applied to the messages, which are then laid
            out as torchtune does (:class:`TorchtuneLlama3Format`, torchtune's tokens). tune's
            :class:`~tune.data.Llama3ChatFormat` (the class, an instance or ``"tune.data.Llama3ChatFormat"``)
            selects instead the chat format of ``meta-llama/Meta-Llama-3-8B-Instruct``, token for token, which
            tune's own configs use; it is also the layout with a ``tokenizer.json`` (a path torchtune did not take).

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a malformed file.
    """

    def __init__(
        self,
        path: str,
        special_tokens: "dict[str, int] | None" = None,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = None,
    ) -> None:
        text, special = _text_tokenizer(path, special_tokens)
        torchtune_format = Llama3ChatFormat() if isinstance(text, HuggingFaceBaseTokenizer) else TorchtuneLlama3Format()
        chat_format, prompt_template = select_chat_format(
            _chat_format_name(prompt_template), {LLAMA3_CHAT_FORMAT}, Llama3ChatFormat(), torchtune_format
        )
        super().__init__(
            text,
            chat_format,
            bos_id=special["<|begin_of_text|>"],
            eos_id=special["<|end_of_text|>"],
            pad_id=special["<|finetune_right_pad_id|>"],
            stop_tokens=[special["<|end_of_text|>"], special["<|eom_id|>"], special["<|eot_id|>"]],
            special_tokens=special,
            max_seq_len=max_seq_len,
            prompt_template=prompt_template,
        )


def llama3_tokenizer(
    path: str,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
) -> Llama3Tokenizer:
    """The Llama 3 tokenizer: torchtune's layout by default (:class:`TorchtuneLlama3Format`), the header-token chat
    format of ``meta-llama/Meta-Llama-3-8B-Instruct`` with ``prompt_template="tune.data.Llama3ChatFormat"``.

    Args:
        path (str): ``tokenizer.model`` (tiktoken BPE file; ``original/tokenizer.model`` in Hugging Face repos),
            or the repository's ``tokenizer.json`` (or its directory), which encodes the same way.
        special_tokens_path (str | None): a Hugging Face ``tokenizer.json`` whose ``added_tokens`` replace the
            built-in special tokens (for checkpoints that renamed reserved tokens).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): see :class:`Llama3Tokenizer`.

    Returns:
        Llama3Tokenizer: BOS ``<|begin_of_text|>``, EOS ``<|end_of_text|>``, pad ``<|finetune_right_pad_id|>``,
        stop tokens ``[<|end_of_text|>, <|eom_id|>, <|eot_id|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a malformed file.
    """
    special = _read_special_tokens(special_tokens_path) if special_tokens_path else None
    return Llama3Tokenizer(path, special, max_seq_len, prompt_template)
