"""SentencePiece tokenizer (``tokenizer.model`` of the Llama 2, Mistral, Gemma and Phi-3 families)."""

import itertools
import os
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import numpy as np

from tune.data._chat_formats import Segment
from tune.data._tokenizers._utils import (
    FlatEncoding,
    TokenBytes,
    encode_chunked_flat,
    require_file,
    unreadable_file,
)

_OTHER_KINDS = (
    " A Llama 3 tokenizer.model is a tiktoken file and a tokenizer.json needs the Hugging Face loader: use the "
    "tokenizer builder of the model's family."
)
# torchtune's test for a vocabulary that encodes whitespace itself (byte fallback or whitespace pieces)
_WHITESPACE_CHARS = (" ", "\n", "\t", "\r", "\v")
# Batches of at least this many texts go to SentencePiece's own thread pool.
_MIN_BATCH = 64
_NUM_THREADS = max(1, min(8, os.cpu_count() or 1))
# A piece that would span a word boundary (a space after another character): "▁" after another character.
_SPANS_BOUNDARY = re.compile("[^\u2581]\u2581")
# The word cache is emptied when it holds this many words (bounds its memory to some tens of MB).
_MAX_CACHED_WORDS = 200_000


def _splits_at_words(serialized_model: bytes) -> "tuple[bool, tuple[str, ...]] | None":
    """Whether this SentencePiece model encodes a text as the concatenation of its words' encodings: None when it
    does not, else ``(dummy_prefix, user_pieces)``: whether it adds a dummy prefix, and its user-defined pieces.

    SentencePiece BPE merges adjacent symbols whose concatenation is a piece, best score first. When no piece
    contains "▁" after another character, no merge crosses the start of a space-led word, so each word's merges
    happen exactly as they would if it were encoded alone; unknown characters fall back to bytes one by one.
    That holds for a BPE model with byte fallback, identity normalisation, no whitespace collapsing and whitespace
    as a prefix, which is how Llama 2, Mistral (dummy prefix) and Gemma (none) build theirs. User-defined pieces
    (Gemma's ``<start_of_turn>``) are matched before merging, so a text holding one is encoded whole; a model with
    one that holds whitespace is not split at all. Anything else is encoded whole.
    """
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(serialized_model)
    trainer, normalizer = model.trainer_spec, model.normalizer_spec
    if not (
        trainer.model_type == trainer.BPE
        and trainer.byte_fallback
        and not trainer.treat_whitespace_as_suffix
        and normalizer.name == "identity"
        and not normalizer.precompiled_charsmap
        and not normalizer.remove_extra_whitespaces
        and normalizer.escape_whitespaces
    ):
        return None
    user_pieces = tuple(piece.piece for piece in model.pieces if piece.type == piece.USER_DEFINED)
    if any(_SPANS_BOUNDARY.search(piece.piece) for piece in model.pieces) or any(
        "\u2581" in piece or any(c.isspace() for c in piece) for piece in user_pieces
    ):
        return None
    return bool(normalizer.add_dummy_prefix), user_pieces


def _without_literal_space_piece(text: str) -> bool:
    return "\u2581" not in text


class SentencePieceBaseTokenizer:
    """Text <-> ids with a SentencePiece model.

    Every call to :meth:`encode` gets the model's dummy prefix (``"▁"`` before the text) when the model has one
    (Llama 2, Mistral); Hugging Face's converted tokenizers for these models do the same for each piece of text
    between special tokens, which is what chat templates produce.

    Args:
        path (str | Path): the ``tokenizer.model`` file.
        special_tokens (Mapping[str, int] | None): tokens added on top of the model with ids at or after its
            vocabulary (Phi-3's ``<|user|>``, ``<|end|>``, ...), as Hugging Face added tokens are.
        rstrip_tokens (Collection[str]): special tokens that swallow the whitespace after them in a chat
            rendering, as the model's Hugging Face ``tokenizer.json`` marks them (``rstrip``).

    Attributes:
        bos_id (int), eos_id (int), pad_id (int): from the model (``pad_id`` is 0 when the model has none).
        vocab_size (int): number of pieces.

    Raises:
        TokenizerFileError: if ``path`` is not a file (a ``FileNotFoundError`` too) or not a SentencePiece model.
    """

    def __init__(
        self,
        path: "str | Path",
        special_tokens: Mapping[str, int] | None = None,
        rstrip_tokens: Collection[str] = (),
    ) -> None:
        import sentencepiece as spm

        hint = "Pass the tokenizer.model file shipped with the model."
        path = require_file(path, "SentencePiece model", hint)
        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as error:
            raise unreadable_file(path, "SentencePiece model", error, hint + _OTHER_KINDS) from error
        self.bos_id: int = self._sp.bos_id()
        self.eos_id: int = self._sp.eos_id()
        self.pad_id: int = self._sp.pad_id() if self._sp.pad_id() >= 0 else 0
        self.special_tokens = dict(special_tokens or {})
        self._extra = {i: t for t, i in self.special_tokens.items() if i >= self._sp.vocab_size()}
        self.vocab_size: int = max([self._sp.vocab_size(), *(i + 1 for i in self._extra)])
        self._rstrip = frozenset(rstrip_tokens)
        # Text in the middle of a string is encoded as "\n" + text with the tokens of "\n" dropped afterwards:
        # SentencePiece puts its dummy prefix only at the very start, and a newline never merges with what follows.
        self._encodes_whitespace = any(self._sp.encode(c) for c in _WHITESPACE_CHARS)
        self._num_newline_tokens = len(self._sp.encode("\n"))
        words = _splits_at_words(self._sp.serialized_model_proto())
        self._by_words = words is not None
        self._dummy_prefix, self._user_pieces = words if words is not None else (True, ())
        self._first_words: dict[str, tuple[int, ...]] = {}
        self._later_words: dict[str, tuple[int, ...]] = {}

    def __getstate__(self) -> dict:
        # the word caches are a speed-up, not part of the tokenizer: keep them out of pickles and cache keys
        state = {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("_first_words", "_later_words", "_piece_bytes", "_piece_bytes_table")
        }
        # a frozenset pickles in hash order, which changes from process to process (and so would the datasets
        # cache key): store it sorted
        state["_rstrip"] = sorted(self._rstrip)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rstrip = frozenset(self._rstrip)
        self._first_words, self._later_words = {}, {}

    def encode(
        self, text: str, add_bos: bool = True, add_eos: bool = True, trim_leading_whitespace: bool = False
    ) -> list[int]:
        """Encodes text.

        Args:
            text (str): the text.
            add_bos (bool): prepend BOS.
            add_eos (bool): append EOS.
            trim_leading_whitespace (bool): encode the text as it reads in the middle of a longer string (no
                dummy-prefix space), as torchtune does for a message that continues a turn. Has no effect when the
                vocabulary cannot encode whitespace on its own.

        Returns:
            list[int]: token ids.
        """
        text, drop = self._prepare_separate(text, trim_leading_whitespace)
        ids = self._sp.encode(text)[drop:]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def _prepare_separate(self, text: str, trim_leading_whitespace: bool) -> tuple[str, int]:
        if trim_leading_whitespace and self._encodes_whitespace:
            return "\n" + text, self._num_newline_tokens
        return text, 0

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text; control and added special tokens are dropped unless ``skip_special_tokens`` is
        False."""
        pieces, run = [], []
        for i in (int(t) for t in token_ids):
            special = i in self._extra or self._sp.is_control(i)
            if not special:
                run.append(i)
            elif not skip_special_tokens:
                pieces.append(self._sp.decode(run))
                pieces.append(self._extra.get(i) or self._sp.id_to_piece(i))
                run = []
        pieces.append(self._sp.decode(run))
        return "".join(pieces)

    def token_id(self, token: str) -> int:
        """The id of a piece (e.g. ``"</s>"``, ``"<start_of_turn>"``).

        Raises:
            ValueError: if the model has no such piece.
        """
        if token in self.special_tokens:
            return self.special_tokens[token]
        i = self._sp.piece_to_id(token)
        if i == self._sp.unk_id() and token != self._sp.id_to_piece(i):
            raise ValueError(f"Token {token!r} is not in this SentencePiece model's vocabulary.")
        return i

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of ``text`` (no BOS/EOS) with each token's UTF-8 byte span in ``text``."""
        return self._encode_with_offsets_batch([text])[0]

    def _encode_with_offsets_batch(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        if len(texts) < _MIN_BATCH:
            protos = [self._encode_proto(text) for text in texts]
        else:
            protos = self._encode_proto(texts, num_threads=_NUM_THREADS)
        out = []
        for proto in protos:
            pieces = proto.pieces
            out.append(([p.id for p in pieces], [(p.begin, p.end) for p in pieces]))
        return out

    def _encode_proto(self, text: "str | list[str]", **kwargs):
        try:
            return self._sp.encode(text, return_type="proto", **kwargs)
        except TypeError:  # sentencepiece < 0.2.1
            return self._sp.encode(text, out_type="immutable_proto", **kwargs)

    def encode_segments(self, segments: Sequence[Segment]) -> tuple[list[int], list[bool]]:
        """Tokens of a rendered conversation and whether each is trainable."""
        return self.encode_segments_batch([segments])[0]

    def encode_segments_batch(self, conversations: Sequence[Sequence[Segment]]) -> list[tuple[list[int], list[bool]]]:
        """:meth:`encode_segments` of several conversations, their texts encoded in one SentencePiece call."""
        return self.encode_segments_flat(conversations).split()

    def encode_segments_flat(self, conversations: Sequence[Sequence[Segment]]) -> FlatEncoding:
        """:meth:`encode_segments_batch` with the conversations end to end (see :class:`FlatEncoding`)."""
        return encode_chunked_flat(
            conversations, self.token_id, self._encode_batch, self._encode_with_offsets_batch, self._rstrip,
            self._prepare_separate, self._token_bytes(),
        )  # fmt: skip

    def _piece_byte_lengths(self) -> list[int] | None:
        """Each piece's length in UTF-8 bytes of the text it stands for ("▁" is one space, a byte piece one byte,
        control pieces none), for models that encode by words (see :func:`_splits_at_words`: identity
        normalisation, so a text's tokens tile its bytes after the dummy-prefix "▁"); None for other models.
        Built on first use."""
        lengths = getattr(self, "_piece_bytes", None)
        if lengths is None and self._by_words and self._sp.piece_to_id("\u2581") != self._sp.unk_id():
            sp = self._sp
            lengths = [
                1 if sp.is_byte(i) else
                0 if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) else
                len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
                for i in range(sp.vocab_size())
            ]  # fmt: skip
            self._piece_bytes = lengths
        return lengths

    def _token_bytes(self) -> TokenBytes | None:
        """Bytes per piece for :func:`encode_chunked_flat` (None for models that do not encode by words): the first
        token's dummy-prefix "▁" stands for no byte of the text, and a text holding a literal "▁" (three bytes that
        become a one-space piece) is not tiled by its tokens."""
        table = self.__dict__.get("_piece_bytes_table")
        if table is None:
            lengths = self._piece_byte_lengths()
            if lengths is None:
                return None
            table = self._piece_bytes_table = np.asarray(lengths, dtype=np.int64)
        return TokenBytes(table, 1 if self._dummy_prefix else 0, _without_literal_space_piece, self._piece_bytes)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._by_words and len(texts) >= _MIN_BATCH:
            return self._encode_by_words(texts)
        return self._encode_whole(texts)

    def _encode_whole(self, texts: list[str]) -> list[list[int]]:
        if len(texts) < _MIN_BATCH:  # SentencePiece starts a thread pool per batch call: not worth it for a few
            return [self._sp.encode(text) for text in texts]
        return self._sp.encode(texts, num_threads=_NUM_THREADS)

    def _encode_by_words(self, texts: list[str]) -> list[list[int]]:
        """Encodes texts word by word from a cache (see :func:`_splits_at_words`): the same ids as encoding each
        text whole, without running BPE again on words seen before.

        A text is split at single spaces (``text.split(" ")``): its first word, with the spaces before it, is
        encoded as a text (with the dummy prefix, when the model adds one), each later word as it reads mid-text:
        ``" " + word``, after a newline whose tokens are dropped when the model adds a dummy prefix. Texts with a
        run of spaces after their first word, a literal "▁" (where a word boundary could fall inside a piece such
        as "▁▁") or a user-defined piece are encoded whole.
        """
        first, later = self._first_words, self._later_words
        if len(later) > _MAX_CACHED_WORDS:
            first.clear()
            later.clear()
        out: list = [None] * len(texts)
        whole, by_words, words = [], [], []
        user_pieces = self._user_pieces
        for index, text in enumerate(texts):
            body = text.lstrip(" ")
            if not body or "  " in body or "\u2581" in text or any(p in text for p in user_pieces):
                whole.append(index)
            else:
                split = body.split(" ")
                if len(body) < len(text):  # leading spaces: part of the first word (" [INST]" is one unit)
                    split[0] = text[: len(text) - len(body)] + split[0]
                by_words.append(index)
                words.append(split)
        new_first = list({w[0] for w in words} - first.keys())
        first.update(zip(new_first, map(tuple, self._encode_whole(new_first))))
        new_later = list(set(itertools.chain.from_iterable(w[1:] for w in words)) - later.keys())
        lead, drop = ("\n ", self._num_newline_tokens) if self._dummy_prefix else (" ", 0)
        encoded = self._encode_whole([lead + word for word in new_later])
        later.update(zip(new_later, (tuple(ids[drop:]) for ids in encoded)))
        chain, get, rest = itertools.chain.from_iterable, later.__getitem__, itertools.islice
        for index, w in zip(by_words, words):
            out[index] = [*first[w[0]], *chain(map(get, rest(w, 1, None)))]
        for index, ids in zip(whole, self._encode_whole([texts[i] for i in whole])):
            out[index] = ids
        return out
