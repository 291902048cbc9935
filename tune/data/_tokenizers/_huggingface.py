"""Tokenizers shipped as Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``): Qwen, Phi-3, and others."""

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tune.data._chat_formats import Segment
from tune.data._tokenizers._byte_level import CHECK_EVERY, CHECKED_TEXTS, ByteLevelEngine
from tune.data._tokenizers._utils import (
    FlatEncoding,
    TokenizerFileError,
    char_flags,
    encode_chunked_flat,
    read_json_file,
    require_file,
    token_flags_batch,
    unreadable_file,
)


class _EngineDisagrees(Exception):
    pass


def _token_content(value: Any) -> str | None:
    """A special token entry of tokenizer_config.json: a string, an AddedToken dict, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    return read_json_file(path, path.name)


class HuggingFaceBaseTokenizer:
    """Text <-> ids with a Hugging Face ``tokenizer.json``, via the ``tokenizers`` library.

    BOS/EOS/PAD come from ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``), falling back to
    ``generation_config.json`` ids. A conversation is encoded in one call on the whole rendered text, exactly as
    ``transformers`` does in ``apply_chat_template`` (added tokens, their ``lstrip``/``rstrip`` flags and the
    normalizer all apply the same way), so special-token strings inside message content become special tokens
    there as they do in ``transformers``. Plain :meth:`encode` instead treats special-token strings as text.

    Args:
        tokenizer_json_path (str | Path): ``tokenizer.json``, or a directory holding it.
        tokenizer_config_json_path (str | Path | None): ``tokenizer_config.json``; default: beside
            ``tokenizer.json`` when present.
        generation_config_path (str | Path | None): ``generation_config.json``; default: beside it when present.

    Attributes:
        bos_id (int | None), eos_id (int | None), pad_id (int | None): special ids (None when not defined).
        vocab_size (int): including added tokens.

    Raises:
        TokenizerFileError: if no tokenizer.json is found (a ``FileNotFoundError`` too), or a file does not parse.
    """

    def __init__(
        self,
        tokenizer_json_path: "str | Path",
        *,
        tokenizer_config_json_path: "str | Path | None" = None,
        generation_config_path: "str | Path | None" = None,
    ) -> None:
        from tokenizers import Tokenizer

        path = Path(tokenizer_json_path).expanduser()
        if path.is_dir():
            path = path / "tokenizer.json"
        hint = "Pass the tokenizer.json file (or its directory) of the model."
        path = require_file(path, "tokenizer.json", hint)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust library raises a bare Exception for a file it cannot parse
            raise unreadable_file(path, "Hugging Face tokenizer.json", error, hint) from error
        config_path = Path(tokenizer_config_json_path or path.parent / "tokenizer_config.json")
        generation_path = Path(generation_config_path or path.parent / "generation_config.json")
        self._setup(tokenizer, _read_json(config_path), _read_json(generation_path), owned=True)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, config: dict | None = None) -> "HuggingFaceBaseTokenizer":
        """Wraps a ``tokenizers.Tokenizer`` built in code.

        Args:
            tokenizer (tokenizers.Tokenizer): the tokenizer.
            config (dict | None): ``tokenizer_config.json``-style entries (``bos_token``, ``eos_token``,
                ``pad_token``).

        Returns:
            HuggingFaceBaseTokenizer: the wrapper.
        """
        self = cls.__new__(cls)
        self._setup(tokenizer, dict(config or {}), {})
        return self

    def _setup(self, tokenizer: Any, config: dict, generation: dict, *, owned: bool = False) -> None:
        self._source = tokenizer.to_str()  # what pickles (see __getstate__)
        self._make_copies(tokenizer if owned else None)  # a tokenizer read here is one of the copies
        self._added = dict(tokenizer.get_added_tokens_decoder())
        self._known_specials: set[str] = set()
        self.config = config
        self.bos_id = self._lookup(config.get("bos_token"), generation.get("bos_token_id"))
        self.eos_id = self._lookup(config.get("eos_token"), generation.get("eos_token_id"))
        self.pad_id = self._lookup(config.get("pad_token"), generation.get("pad_token_id"))
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    def _make_copies(self, chat: Any = None) -> None:
        from tokenizers import Tokenizer

        # Copies without the post-processor (which may add BOS or trim offsets): we add BOS/EOS ourselves and
        # need untrimmed character offsets for the loss mask. The plain-text copy does not parse special tokens.
        self._chat = chat if chat is not None else Tokenizer.from_str(self._source)
        self._chat.post_processor = None
        self._text = Tokenizer.from_str(self._source)
        self._text.post_processor = None
        self._text.encode_special_tokens = True

    def _lookup(self, token: Any, fallback: Any) -> int | None:
        content = _token_content(token)
        if content is not None:
            return self.token_id(content)
        if isinstance(fallback, list):  # generation_config may list several EOS ids; the first is the main one
            fallback = fallback[0] if fallback else None
        return fallback if isinstance(fallback, int) else None

    def token_id(self, token: str) -> int:
        """The id of a token string (usually a special token).

        Raises:
            ValueError: if the vocabulary has no such token.
        """
        i = self._chat.token_to_id(token)
        if i is None:
            raise ValueError(f"Token {token!r} is not in the vocabulary of this tokenizer.json.")
        return i

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes text; special-token strings in it are encoded as ordinary text.

        Args:
            text (str): the text.
            add_bos (bool): prepend BOS (when the tokenizer has one).
            add_eos (bool): append EOS (when the tokenizer has one).

        Returns:
            list[int]: token ids.
        """
        ids = self._text.encode(text, add_special_tokens=False).ids
        bos = [self.bos_id] if add_bos and self.bos_id is not None else []
        eos = [self.eos_id] if add_eos and self.eos_id is not None else []
        return bos + ids + eos

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text, dropping special tokens unless ``skip_special_tokens`` is False."""
        return self._chat.decode([int(i) for i in token_ids], skip_special_tokens=skip_special_tokens)

    def encode_segments(self, segments: Sequence[Segment]) -> tuple[list[int], list[bool]]:
        """Tokens of a rendered conversation and whether each is trainable.

        The whole text is encoded at once; an ordinary token is trained when it overlaps a trained segment, an
        added token (``<|im_end|>``, which may also swallow neighbouring whitespace) takes the flag of the segment
        it starts in.

        Raises:
            ValueError: for a special token the vocabulary lacks, or a ``separate`` segment (the layout without a
                chat template is SentencePiece-only, as in torchtune).
        """
        return self.encode_segments_batch([segments])[0]

    def encode_segments_batch(self, conversations: Sequence[Sequence[Segment]]) -> list[tuple[list[int], list[bool]]]:
        """:meth:`encode_segments` of several conversations, encoded in one (multithreaded) ``encode_batch``, or
        with tiktoken for a byte-level BPE (see ``_byte_level``: the same ids, several times faster)."""
        return self.encode_segments_flat(conversations).split()

    def encode_segments_flat(self, conversations: Sequence[Sequence[Segment]]) -> FlatEncoding:
        """:meth:`encode_segments_batch` with the conversations end to end (see :class:`FlatEncoding`)."""
        for segments in conversations:
            for segment in segments:
                self._check_segment(segment)
        engine = self._byte_level_engine()
        if engine is not None and all(s.text in engine.added for c in conversations for s in c if s.special):
            encoded = self._encode_with_engine(engine, conversations)
            if encoded is not None:
                return encoded
        texts, all_flags = [], []
        for segments in conversations:
            text, flags = char_flags(segments)
            texts.append(text)
            all_flags.append(flags)
        encodings = self._chat.encode_batch(texts, add_special_tokens=False)
        ids = [encoding.ids for encoding in encodings]
        offsets = [encoding.offsets for encoding in encodings]
        return FlatEncoding.join(list(zip(ids, token_flags_batch(offsets, all_flags, ids, self._added))))

    def _byte_level_engine(self) -> ByteLevelEngine | None:
        engine = self.__dict__.get("_engine", False)
        if engine is False:  # built on first use: reading a 150k-token vocabulary costs a fraction of a second
            engine = self._engine = ByteLevelEngine.for_tokenizer(self._chat)
        return engine

    def __getstate__(self) -> dict:
        # Pickled (for datasets' worker processes) and hashed (for their cache keys) as the tokenizer.json text:
        # the two copies are rebuilt from it (each pickles as its own JSON, slow to pickle and to unpickle with a
        # 150k vocabulary). Caches are rebuilt where they are used: the state must not depend on them.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_chat", "_text", "_engine")}
        state["_known_specials"] = set()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_copies()

    def _encode_with_engine(self, engine: ByteLevelEngine, conversations: Sequence[Sequence[Segment]]):
        """The conversations' texts between special tokens encoded by the engine (None when it disagrees with
        ``tokenizers`` on the texts it checks: it is then dropped for good). The engine's first texts are all
        checked, then one text in every CHECK_EVERY, so that a call per conversation does not pay for two
        tokenizers."""

        def encode_batch(texts: list[str]) -> list[list[int]]:
            seen = engine.texts_seen
            engine.texts_seen += len(texts)
            if seen < CHECKED_TEXTS:
                sample = texts[: CHECKED_TEXTS - seen]
            else:
                sample = texts[-seen % CHECK_EVERY :: CHECK_EVERY]  # the texts whose running number is a multiple
            if sample and not engine.agrees_with(self._chat, sample):
                raise _EngineDisagrees
            return engine.encode_batch(texts)

        try:
            return encode_chunked_flat(
                conversations, self.token_id, encode_batch, self._encode_with_byte_offsets_batch,
                token_bytes=engine.token_bytes,
            )  # fmt: skip
        except _EngineDisagrees:
            self._engine = None
            return None

    def _encode_with_byte_offsets_batch(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Ids and UTF-8 byte spans (``tokenizers`` gives character spans) of each text."""
        out = []
        for text, encoding in zip(texts, self._chat.encode_batch(texts, add_special_tokens=False)):
            offsets = encoding.offsets
            if not text.isascii():
                at = [0, *itertools.accumulate(len(c.encode("utf-8")) for c in text)]
                offsets = [(at[start], at[end]) for start, end in offsets]
            out.append((encoding.ids, offsets))
        return out

    def _check_segment(self, segment: Segment) -> None:
        if segment.separate:
            raise ValueError(
                "a tokenizer.json tokenizer encodes a conversation as one text; it cannot encode messages "
                "separately (the layout without a chat template). Use the family's chat template."
            )
        if segment.special and segment.text not in self._known_specials:
            self.token_id(segment.text)  # raises for a token the vocabulary lacks
            self._known_specials.add(segment.text)


def byte_level_bpe_tokenizer(
    vocab_path: "str | Path",
    merges_path: "str | Path",
    *,
    pattern: str,
    added_tokens: Sequence[tuple[str, bool]],
    nfc: bool = True,
) -> Any:
    """Builds a byte-level BPE ``tokenizers.Tokenizer`` from GPT-2-style ``vocab.json`` and ``merges.txt``.

    Args:
        vocab_path (str | Path): ``vocab.json`` (token -> id).
        merges_path (str | Path): ``merges.txt`` (one merge per line; a ``#version`` first line is skipped).
        pattern (str): the pre-tokenisation regex.
        added_tokens (Sequence[tuple[str, bool]]): ``(content, special)`` pairs, given ids after the vocabulary
            in this order.
        nfc (bool): apply NFC normalisation first (Qwen does).

    Returns:
        tokenizers.Tokenizer: the tokenizer.

    Raises:
        FileNotFoundError: if a file is missing.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab_path = require_file(vocab_path, "vocab.json", "Pass the vocab.json file shipped with the model.")
    merges_path = require_file(merges_path, "merges.txt", "Pass the merges.txt file shipped with the model.")
    try:
        tokenizer = Tokenizer(BPE.from_file(str(vocab_path), str(merges_path)))
    except Exception as error:  # the Rust library raises a bare Exception for files it cannot parse
        said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise TokenizerFileError(
            f"{str(vocab_path)!r} and {str(merges_path)!r} are not a valid vocab.json + merges.txt pair ({said})."
        ) from error
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    for content, special in added_tokens:
        token = AddedToken(content, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    return tokenizer


def load_byte_level_bpe(
    path: "str | Path",
    merges_file: "str | Path | None" = None,
    special_tokens_path: "str | Path | None" = None,
    *,
    pattern: str,
    added_tokens: Sequence[tuple[str, bool]],
) -> HuggingFaceBaseTokenizer:
    """Loads a byte-level BPE tokenizer from ``tokenizer.json`` (file or directory), or from ``vocab.json`` plus
    ``merges_file`` (torchtune's Qwen arguments).

    Args:
        path (str | Path): ``tokenizer.json``, its directory, or ``vocab.json`` (with ``merges_file``).
        merges_file (str | Path | None): ``merges.txt``.
        special_tokens_path (str | Path | None): a tokenizer.json whose ``added_tokens`` replace ``added_tokens``
            (vocab/merges only).
        pattern (str): pre-tokenisation regex (vocab/merges only).
        added_tokens (Sequence[tuple[str, bool]]): ``(content, special)`` added after the vocabulary
            (vocab/merges only).

    Returns:
        HuggingFaceBaseTokenizer: the tokenizer.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without ``merges_file``.
    """
    if merges_file is None:
        if Path(path).name == "vocab.json":
            raise ValueError(
                f"{str(path)!r} is a vocab.json: pass merges_file too, or pass the tokenizer.json instead."
            )
        return HuggingFaceBaseTokenizer(path)
    if special_tokens_path is not None:
        file = require_file(special_tokens_path, "special_tokens_path", "Pass the model's tokenizer.json.")
        entries = read_json_file(file, "special_tokens_path").get("added_tokens", [])
        added_tokens = [(e["content"], bool(e.get("special", True))) for e in sorted(entries, key=lambda e: e["id"])]
    tokenizer = byte_level_bpe_tokenizer(path, merges_file, pattern=pattern, added_tokens=added_tokens)
    return HuggingFaceBaseTokenizer.from_tokenizer(tokenizer)
