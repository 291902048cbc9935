"""Phi-3 mini tokenizer: Llama-style SentencePiece (or its tokenizer.json) with Phi-3's added chat tokens."""

from pathlib import Path

from tune.data._chat_formats import Phi3ChatFormat
from tune.data._tokenizers import (
    ChatTokenizer,
    HuggingFaceBaseTokenizer,
    PromptTemplate,
    SentencePieceBaseTokenizer,
)

# Phi-3's added tokens, numbered from the end of the 32000-piece SentencePiece vocabulary (offset 0 = 32000), and
# whether each strips the whitespace after it (``rstrip`` in microsoft/Phi-3-mini-4k-instruct's tokenizer config).
PHI3_ADDED_TOKENS = [
    ("<|endoftext|>", False),
    ("<|assistant|>", True),
    ("<|placeholder1|>", True),
    ("<|placeholder2|>", True),
    ("<|placeholder3|>", True),
    ("<|placeholder4|>", True),
    ("<|system|>", True),
    ("<|end|>", True),
    ("<|placeholder5|>", True),
    ("<|placeholder6|>", True),
    ("<|user|>", True),
]


def _text_tokenizer(
    path: str, special_tokens: "dict[str, int] | None"
) -> "SentencePieceBaseTokenizer | HuggingFaceBaseTokenizer":
    file = Path(path).expanduser()
    if file.is_dir() or file.suffix == ".json":
        return HuggingFaceBaseTokenizer(file)
    if special_tokens is None:
        base = SentencePieceBaseTokenizer(path).vocab_size
        special_tokens = {token: base + offset for offset, (token, _) in enumerate(PHI3_ADDED_TOKENS)}
    rstrip = [token for token, strips in PHI3_ADDED_TOKENS if strips]
    return SentencePieceBaseTokenizer(path, dict(special_tokens), rstrip_tokens=rstrip)


class Phi3MiniTokenizer(ChatTokenizer):
    """The Phi-3 mini tokenizer (torchtune's class; :func:`phi3_mini_tokenizer` returns one).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece), or ``tokenizer.json`` / its directory (added tokens and
            their flags read from the file).
        special_tokens (dict[str, int] | None): with a ``tokenizer.model``, added token -> id. Default None:
            Phi-3's added tokens numbered from 32000.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Raises:
        FileNotFoundError: if a file does not exist.
    """

    def __init__(
        self,
        path: str,
        special_tokens: "dict[str, int] | None" = None,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = None,
    ) -> None:
        text = _text_tokenizer(path, special_tokens)
        end_of_text, end = text.token_id("<|endoftext|>"), text.token_id("<|end|>")
        super().__init__(
            text,
            Phi3ChatFormat(eos_token="<|endoftext|>"),
            bos_id=text.token_id("<s>"),
            eos_id=end_of_text,
            pad_id=end_of_text,
            stop_tokens=[end, end_of_text],
            special_tokens={token: text.token_id(token) for token, _ in PHI3_ADDED_TOKENS},
            max_seq_len=max_seq_len,
            prompt_template=prompt_template,
        )


def phi3_mini_tokenizer(
    path: str,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
) -> Phi3MiniTokenizer:
    """The Phi-3 mini tokenizer with the chat format of ``microsoft/Phi-3-mini-4k-instruct``.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece; Phi-3's added tokens get ids 32000..32010), or
            ``tokenizer.json`` / its directory (added tokens and their flags read from the file).
        special_tokens_path (str | None): with a ``tokenizer.model``, a tokenizer.json to take the added-token ids
            from.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        Phi3MiniTokenizer: BOS ``<s>``, EOS and pad ``<|endoftext|>``, stop tokens ``[<|end|>, <|endoftext|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
    """
    special = None
    if special_tokens_path is not None:
        reference = HuggingFaceBaseTokenizer(special_tokens_path)
        special = {token: reference.token_id(token) for token, _ in PHI3_ADDED_TOKENS}
    return Phi3MiniTokenizer(path, special, max_seq_len, prompt_template)
