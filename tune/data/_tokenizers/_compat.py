"""torchtune's tokenizer helpers that tune's own tokenizers do not need, kept for code written against torchtune:
a GPT-2 vocab/merges tokenizer, the special tokens of a ``tokenizer.json``, and the layout of a conversation
without a chat template."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tune.data._chat_formats import Segment
from tune.data._messages import Message
from tune.data._tokenizers._huggingface import byte_level_bpe_tokenizer
from tune.data._tokenizers._utils import read_json_file, require_file, truncate

# GPT-2's pre-tokenisation regex (openai/gpt-2, src/encoder.py).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class GPT2BaseTokenizer:
    """Byte-level BPE from GPT-2-style ``vocab.json`` and ``merges.txt``.

    Args:
        vocab_path (str): ``vocab.json`` (token -> id).
        merges_path (str): ``merges.txt``.
        unk_id (int | None): id of the unknown token.
        bos_id (int | None): id prepended by ``encode(add_bos=True)``.
        eos_id (int | None): id appended by ``encode(add_eos=True)``.
        pad_id (int | None): id to pad with.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: if the files are not a valid vocab/merges pair.
    """

    def __init__(
        self,
        vocab_path: str,
        merges_path: str,
        unk_id: int | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ) -> None:
        self.tokenizer = byte_level_bpe_tokenizer(vocab_path, merges_path, pattern=GPT2_PATTERN, added_tokens=(),
                                                  nfc=False)  # fmt: skip
        self.unk_id, self.bos_id, self.eos_id, self.pad_id = unk_id, bos_id, eos_id, pad_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Token ids of ``text``, with BOS/EOS when asked for (and set)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = [self.bos_id] if add_bos and self.bos_id is not None else []
        return bos + ids + ([self.eos_id] if add_eos and self.eos_id is not None else [])

    def decode(self, tokens: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id (byte-level strings, as torchtune returns them; join and byte-decode
        them for text). Unknown ids give None."""
        return [self.tokenizer.id_to_token(int(t)) for t in tokens]


def parse_hf_tokenizer_json(tokenizer_json_path: str) -> dict[str, int]:
    """The added tokens of a Hugging Face ``tokenizer.json``: content -> id.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not JSON.
    """
    path = require_file(tokenizer_json_path, "tokenizer.json", "Pass the model's tokenizer.json.")
    data = read_json_file(Path(path), "tokenizer.json")
    return {token["content"]: token["id"] for token in data.get("added_tokens", [])}


def _encode_piece(tokenizer: Any, text: str, trim_leading_whitespace: bool) -> list[int]:
    encode_segments = getattr(tokenizer, "encode_segments", None)
    if encode_segments is not None:
        segment = Segment(text, True, separate=True, trim_leading_whitespace=trim_leading_whitespace)
        return encode_segments([segment])[0]
    return tokenizer.encode(text, add_bos=False, add_eos=False)


def tokenize_messages_no_special_tokens(
    tokenizer: Any,
    messages: list[Message],
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> tuple[list[int], list[bool]]:
    """A conversation laid out without a chat template, as torchtune's SentencePiece tokenizers do with
    ``prompt_template=None``: ``bos_id`` opens each turn (the first message and each message after an assistant
    message), ``eos_id`` closes each assistant message, each message is encoded on its own with its trailing spaces
    removed (a message continuing a turn without a space before it gets no SentencePiece dummy-prefix space), and
    every token carries its message's ``masked`` flag.

    Args:
        tokenizer (ModelTokenizer): a tune tokenizer (its text tokenizer does the encoding) or any object with
            ``encode(text, add_bos, add_eos)``; its ``max_seq_len`` truncates when set.
        messages (list[Message]): the conversation.
        bos_id (int | None): id opening each turn; None adds none.
        eos_id (int | None): id closing each assistant message; None adds none.

    Returns:
        tuple[list[int], list[bool]]: tokens and mask (True where a token gets no loss), cut to ``max_seq_len``
        with the last token replaced by ``eos_id`` when set.
    """
    text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    tokens: list[int] = []
    mask: list[bool] = []
    start_of_turn, previous_ends_with_space = True, False
    for message in messages:
        text = message.text_content
        if start_of_turn and bos_id is not None:
            tokens.append(bos_id)
            mask.append(message.masked)
        ids = _encode_piece(text_tokenizer, text.rstrip(" "), not start_of_turn and not previous_ends_with_space)
        tokens += ids
        mask += [message.masked] * len(ids)
        previous_ends_with_space = text.endswith(" ")
        start_of_turn = message.role == "assistant"
        if start_of_turn and eos_id is not None:
            tokens.append(eos_id)
            mask.append(message.masked)
    max_seq_len = getattr(tokenizer, "max_seq_len", None)
    if max_seq_len is not None and messages:
        tokens = truncate(tokens, max_seq_len, eos_id)
        mask = truncate(mask, max_seq_len, messages[-1].masked if eos_id is not None else None)
    return tokens, mask
