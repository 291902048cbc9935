"""tiktoken-format BPE tokenizer (the Llama 3 family's ``tokenizer.model``: one ``base64(token) rank`` per line)."""

import base64
import binascii
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tune.data._chat_formats import Segment
from tune.data._tokenizers._utils import (
    FlatEncoding,
    TokenBytes,
    TokenizerFileError,
    encode_chunked_flat,
    require_file,
    token_byte_table,
)

# tiktoken is quadratic on very long runs of whitespace (or of non-whitespace), and refuses strings over ~400k
# characters; long inputs are cut into pieces that stay under both limits before encoding.
_MAX_CHARS = 400_000
_MAX_RUN = 25_000
# Texts up to this many characters are cached (see _encode_pieces), at most this many of them.
_SHORT_TEXT = 16
_MAX_SHORT_TEXTS = 10_000


def load_tiktoken_ranks(path: "str | Path") -> dict[bytes, int]:
    """Reads a tiktoken BPE file: one ``base64(token_bytes) rank`` pair per line.

    Args:
        path (str | Path): the file.

    Returns:
        dict[bytes, int]: token bytes -> rank (= token id).

    Raises:
        TokenizerFileError: if the file does not exist (a ``FileNotFoundError`` too), holds no tokens, or has a
            malformed line (its number is given).
    """
    path = require_file(path, "tiktoken BPE file", "Pass the tokenizer.model file shipped with the model.")
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise TokenizerFileError(
                f"{path}:{number} is not a tiktoken BPE line ('<base64 token> <rank>'): {line[:80]!r}. Is this a "
                "SentencePiece model instead? Use the family's tokenizer builder that matches the file."
            ) from None
    if not ranks:
        raise TokenizerFileError(f"tiktoken BPE file {str(path)!r} holds no tokens: it is empty or truncated.")
    return ranks


def _split_long(text: str) -> list[str]:
    """Pieces of ``text`` with at most _MAX_CHARS characters and no same-kind run longer than _MAX_RUN."""
    if len(text) <= _MAX_RUN:
        return [text]
    pieces, start, run, kind = [], 0, 0, None
    for i, ch in enumerate(text):
        is_space = ch.isspace()
        run = run + 1 if is_space == kind else 1
        kind = is_space
        if run > _MAX_RUN or i - start >= _MAX_CHARS:
            pieces.append(text[start:i])
            start, run = i, 1
    pieces.append(text[start:])
    return pieces


def _always(text: str) -> bool:
    return True


class TikTokenBaseTokenizer:
    """Text <-> ids with a tiktoken BPE file, a pre-tokenisation regex and special tokens.

    Args:
        path (str | Path): the BPE file (``tokenizer.model`` of Llama 3).
        name (str): a name for the encoding.
        pattern (str): the pre-tokenisation regex.
        bos_id (int): id prepended by ``encode(add_bos=True)``.
        eos_id (int): id appended by ``encode(add_eos=True)``.
        special_tokens (Mapping[str, int]): special token string -> id (ids after the BPE ranks).
        ranks (dict[bytes, int] | None): the ranks of ``path`` when already read with :func:`load_tiktoken_ranks`.

    Raises:
        FileNotFoundError: if ``path`` is not a file.
        ValueError: for a malformed file.
    """

    def __init__(
        self,
        path: "str | Path",
        name: str,
        pattern: str,
        bos_id: int,
        eos_id: int,
        special_tokens: Mapping[str, int],
        *,
        ranks: dict[bytes, int] | None = None,
    ) -> None:
        ranks = load_tiktoken_ranks(path) if ranks is None else ranks
        self.special_tokens = dict(special_tokens)
        self.bos_id, self.eos_id = bos_id, eos_id
        self._build(name, pattern, ranks)

    def _build(self, name: str, pattern: str, ranks: dict[bytes, int]) -> None:
        import tiktoken

        self._encoding = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )
        self.vocab_size: int = self._encoding.n_vocab
        self._special_ids = frozenset(self.special_tokens.values())
        self._num_bytes = {rank: len(token) for token, rank in ranks.items()}
        self._short_texts: dict[str, tuple[int, ...]] = {}
        self._ranks = ranks

    def __getstate__(self) -> dict:
        # Pickled (for datasets' worker processes) and hashed (for their cache keys) as the ranks packed into three
        # flat buffers: the tiktoken encoding itself pickles as dicts of Python objects, slow to pickle and to hash
        # with Llama 3's 128k ranks. The short-text cache is a speed-up, not part of the tokenizer: left out. The
        # encoding is rebuilt from the ranks on unpickling.
        packed = self.__dict__.get("_packed_ranks")
        if packed is None:
            tokens = list(self._ranks)
            packed = self._packed_ranks = (
                b"".join(tokens),
                np.fromiter(map(len, tokens), dtype=np.int32, count=len(tokens)).tobytes(),
                np.fromiter(self._ranks.values(), dtype=np.int64, count=len(tokens)).tobytes(),
            )
        kept = ("special_tokens", "bos_id", "eos_id")
        return {
            **{k: self.__dict__[k] for k in kept},
            "_name": self._encoding.name,
            "_pattern": self._encoding._pat_str,
            "_packed_ranks": packed,
        }

    def __setstate__(self, state: dict) -> None:
        blob, lengths, ranks = state.pop("_packed_ranks")
        name, pattern = state.pop("_name"), state.pop("_pattern")
        self.__dict__.update(state)
        ends = np.cumsum(np.frombuffer(lengths, dtype=np.int32), dtype=np.int64).tolist()
        tokens = [blob[start:end] for start, end in zip([0, *ends[:-1]], ends)]
        self._build(name, pattern, dict(zip(tokens, np.frombuffer(ranks, dtype=np.int64).tolist())))
        self._packed_ranks = (blob, lengths, ranks)

    def _encode_text(self, text: str) -> list[int]:
        return self._encode_batch([text])[0]

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        # special-token strings inside text are plain text: only the chat format inserts special tokens
        if all(len(text) <= _MAX_RUN for text in texts):
            return self._encode_pieces(texts)
        pieces, owners = [], []
        for index, text in enumerate(texts):
            for piece in _split_long(text):
                pieces.append(piece)
                owners.append(index)
        out: list[list[int]] = [[] for _ in texts]
        for owner, ids in zip(owners, self._encode_pieces(pieces)):
            out[owner].extend(ids)
        return out

    def _encode_pieces(self, texts: list[str]) -> list[list[int]]:
        # one call per text: tiktoken's encode_ordinary_batch submits each text to a thread pool, which costs
        # several times the encoding itself for chat-sized texts. Short texts (a chat header's role name, every
        # turn) are looked up in a small cache instead.
        encode, short = self._encoding.encode_ordinary, self._short_texts
        if len(short) > _MAX_SHORT_TEXTS:
            short.clear()
        out = []
        for text in texts:
            if len(text) > _SHORT_TEXT:
                out.append(encode(text))
            elif text in short:
                out.append(list(short[text]))
            else:
                ids = encode(text)
                short[text] = tuple(ids)
                out.append(ids)
        return out

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes text (special-token strings in it are encoded as ordinary text).

        Args:
            text (str): the text.
            add_bos (bool): prepend BOS.
            add_eos (bool): append EOS.

        Returns:
            list[int]: token ids.
        """
        return [self.bos_id] * add_bos + self._encode_text(text) + [self.eos_id] * add_eos

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text, dropping special tokens unless ``skip_special_tokens`` is False."""
        ids = [int(i) for i in token_ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self._encoding.decode(ids)

    def token_id(self, token: str) -> int:
        """The id of a special token.

        Raises:
            ValueError: if ``token`` is not one of the special tokens.
        """
        try:
            return self.special_tokens[token]
        except KeyError:
            raise ValueError(f"{token!r} is not a special token of this tokenizer.") from None

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of ``text`` (no BOS/EOS) with each token's UTF-8 byte span in ``text``."""
        return self._encode_with_offsets_batch([text])[0]

    def _encode_with_offsets_batch(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        out = []
        for ids in self._encode_batch(texts):
            ends = np.cumsum([self._num_bytes[i] for i in ids], dtype=np.int64)  # tokens tile the text's bytes
            starts = np.concatenate(([0], ends[:-1])) if len(ids) else ends
            out.append((ids, list(zip(starts.tolist(), ends.tolist()))))
        return out

    def encode_segments(self, segments: Sequence[Segment]) -> tuple[list[int], list[bool]]:
        """Tokens of a rendered conversation and whether each is trainable."""
        return self.encode_segments_batch([segments])[0]

    def encode_segments_batch(self, conversations: Sequence[Sequence[Segment]]) -> list[tuple[list[int], list[bool]]]:
        """:meth:`encode_segments` of several conversations, their texts encoded in one batch.

        A ``separate`` segment needs no trimming here: tiktoken adds no space before a text.
        """
        return self.encode_segments_flat(conversations).split()

    def encode_segments_flat(self, conversations: Sequence[Sequence[Segment]]) -> FlatEncoding:
        """:meth:`encode_segments_batch` with the conversations end to end (see :class:`FlatEncoding`)."""
        return encode_chunked_flat(
            conversations, self.token_id, self._encode_batch, self._encode_with_offsets_batch,
            token_bytes=self._token_bytes(),
        )  # fmt: skip

    def _token_bytes(self) -> TokenBytes:
        """Bytes per token id: byte-level BPE tokens tile the text's UTF-8 bytes."""
        table = self.__dict__.get("_bytes_table")
        if table is None:
            table = self._bytes_table = token_byte_table(self._num_bytes)
        return TokenBytes(table, 0, _always, self._num_bytes)
