"""Phi-3 mini tokenizer: Llama-style SentencePiece (or its tokenizer.json) with Phi-3's added chat tokens."""

from pathlib import Path

from tune.data._chat_formats import Phi3ChatFormat, TorchtunePhi3Format, named_chat_format
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


def _is_tokenizer_json(path: str) -> bool:
    file = Path(path).expanduser()
    return file.is_dir() or file.suffix == ".json"


def _text_tokenizer(
    path: str, special_tokens: "dict[str, int] | None", rstrip: bool
) -> "SentencePieceBaseTokenizer | HuggingFaceBaseTokenizer":
    """The text tokenizer; with a ``tokenizer.model`` and ``rstrip``, the added tokens that strip the whitespace
    after them do so (as Phi-3's tokenizer.json has it; torchtune's layout strips nothing)."""
    if _is_tokenizer_json(path):
        return HuggingFaceBaseTokenizer(Path(path).expanduser())
    if special_tokens is None:
        base = SentencePieceBaseTokenizer(path).vocab_size
        special_tokens = {token: base + offset for offset, (token, _) in enumerate(PHI3_ADDED_TOKENS)}
    strips = [token for token, strips in PHI3_ADDED_TOKENS if strips] if rstrip else []
    return SentencePieceBaseTokenizer(path, dict(special_tokens), rstrip_tokens=strips)


class Phi3MiniTokenizer(ChatTokenizer):
    """The Phi-3 mini tokenizer (torchtune's class; :func:`phi3_mini_tokenizer` returns one). With a
    ``tokenizer.model`` conversations are laid out as torchtune lays them out
    (:class:`TorchtunePhi3Format`: ``<s>`` first, a "\\n" after each role tag, no
    ``<|endoftext|>`` after an answer, every token carrying its message's mask); ``prompt_template:
    tune.data.Phi3ChatFormat`` selects the chat template of ``microsoft/Phi-3-mini-4k-instruct`` token for token,
    as tune's configs do. A ``tokenizer.json`` (which torchtune did not take) gets that chat template unless
    another is named.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece), or ``tokenizer.json`` / its directory (added tokens and
            their flags read from the file).
        special_tokens (dict[str, int] | None): with a ``tokenizer.model``, added token -> id. Default None:
            Phi-3's added tokens numbered from 32000.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages (as in
            torchtune), or :class:`~tune.data.Phi3ChatFormat` (by dotted name, class or instance): that chat
            template instead of torchtune's layout.

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
        chat_format = named_chat_format(prompt_template, (Phi3ChatFormat,))
        if chat_format is not None:
            prompt_template = None
        elif _is_tokenizer_json(path):
            chat_format = Phi3ChatFormat(eos_token="<|endoftext|>")
        else:
            chat_format = TorchtunePhi3Format(bos_token="<s>")
        text = _text_tokenizer(path, special_tokens, rstrip=not isinstance(chat_format, TorchtunePhi3Format))
        end_of_text, end = text.token_id("<|endoftext|>"), text.token_id("<|end|>")
        super().__init__(
            text,
            chat_format,
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
    """The Phi-3 mini tokenizer: torchtune's layout with a ``tokenizer.model``, the chat template of
    ``microsoft/Phi-3-mini-4k-instruct`` with ``prompt_template="tune.data.Phi3ChatFormat"`` (see
    :class:`Phi3MiniTokenizer`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece; Phi-3's added tokens get ids 32000..32010), or
            ``tokenizer.json`` / its directory (added tokens and their flags read from the file).
        special_tokens_path (str | None): with a ``tokenizer.model``, a tokenizer.json to take the added-token ids
            from.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): see :class:`Phi3MiniTokenizer`.

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
