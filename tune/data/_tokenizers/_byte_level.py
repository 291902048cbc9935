"""tiktoken as the encoder of byte-level BPE ``tokenizer.json`` files (Qwen, Llama 3's tokenizer.json).

``tokenizers`` spends most of a chat sample's time outside the BPE itself (normalizer, Oniguruma regex, ``Encoding``
objects with offsets): on Alpaca-sized texts it is several times slower than tiktoken. A byte-level BPE whose
pre-tokenizer is one regex split followed by the byte-to-unicode mapping, and whose merges produce tokens in id
order, is the same tokenizer as a tiktoken encoding with ``rank = id``: both split the text with the regex, map
it to bytes and merge the adjacent pair that makes the lowest-ranked token until none is left. (A merge list
that made a token of a pair other than its own merge could differ: the engine's first texts and then one in every
64 are also encoded with ``tokenizers``, and the engine is dropped, with a warning, at the first difference.)

Only what tiktoken has no part for is done here: added tokens inside a text are split off first (as
``tokenizers`` does before normalising), and text that is not ASCII is NFC-normalised when the tokenizer says so.
"""

import json
import re
import unicodedata
from typing import Any

from tune.data._tokenizers._utils import TokenBytes, token_byte_table
from tune.utils import get_logger

_log = get_logger(name=__name__)

# The engine's first texts are also encoded with ``tokenizers`` to check it, then one text in every CHECK_EVERY.
CHECKED_TEXTS = 32
CHECK_EVERY = 64


def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character mapping (GPT-2's ``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    decoder, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            decoder[chr(byte)] = byte
        else:
            decoder[chr(256 + extra)] = byte
            extra += 1
    return decoder


def _split_pattern(pre_tokenizer: dict | None) -> str | None:
    """The regex of a ``Sequence[Split(regex, isolated), ByteLevel(use_regex=False)]`` pre-tokenizer, else None."""
    if not pre_tokenizer or pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if not (
        split.get("type") == "Split"
        and "Regex" in (split.get("pattern") or {})
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and not byte_level.get("add_prefix_space")
        and not byte_level.get("use_regex", True)
    ):
        return None
    return split["pattern"]["Regex"]


class ByteLevelEngine:
    """Encodes texts like a byte-level BPE ``tokenizers.Tokenizer`` (without its post-processor), with tiktoken.

    Build it with :meth:`for_tokenizer`, which returns None for tokenizers it cannot stand in for.
    """

    def __init__(self, pattern: str, ranks: dict[bytes, int], added: dict[str, int], nfc: bool) -> None:
        import tiktoken

        self._encoding = tiktoken.Encoding(name="tune-byte-level", pat_str=pattern, mergeable_ranks=ranks,
                                           special_tokens={})  # fmt: skip
        self._encode = self._encoding.encode_ordinary
        self.added = added
        self._added_split = (
            re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) if added else None
        )
        self._nfc = nfc
        self._first_chars = frozenset(t[0] for t in added if t)  # a text without any of them holds no added token
        self.num_bytes = {rank: len(token) for token, rank in ranks.items()}
        self.num_bytes.update((i, len(content.encode("utf-8"))) for content, i in added.items())
        self.texts_seen = 0  # texts encoded so far (for the sampled check against tokenizers)
        self.token_bytes = TokenBytes(token_byte_table(self.num_bytes), 0, self.tiles, self.num_bytes)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> "ByteLevelEngine | None":
        """The engine for ``tokenizer`` (a ``tokenizers.Tokenizer``), or None when it is not a byte-level BPE this
        engine reproduces (another model, normalizer or pre-tokenizer, dropout, added tokens that strip spaces or
        are normalised, merges out of id order)."""
        spec = json.loads(tokenizer.to_str())
        model, normalizer = spec.get("model") or {}, spec.get("normalizer")
        pattern = _split_pattern(spec.get("pre_tokenizer"))
        if (
            pattern is None
            or model.get("type") != "BPE"
            or model.get("dropout")
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or model.get("byte_fallback")
            or model.get("ignore_merges")
            or normalizer not in (None, {"type": "NFC"})
        ):
            return None
        added = {}
        for i, token in tokenizer.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word or token.normalized:
                return None
            added[token.content] = i
        decoder = _byte_decoder()
        vocab = model.get("vocab") or {}
        try:
            ranks = {bytes(decoder[c] for c in token): i for token, i in vocab.items() if token not in added}
        except KeyError:  # a token outside the byte-level alphabet
            return None
        if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
            return None
        merged = []
        for merge in model.get("merges") or []:
            left, right = merge.split(" ") if isinstance(merge, str) else merge
            merged.append(vocab.get(left + right, -1))
        if any(i < 0 for i in merged) or any(a >= b for a, b in zip(merged, merged[1:])):
            return None  # a merge's result missing, or merges not in id order: ranks would not be merge priorities
        return cls(pattern, ranks, added, normalizer is not None)

    def _encode_piece(self, text: str) -> list[int]:
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return self._encode(text)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; added-token strings in it become their ids, as ``tokenizers`` matches them."""
        if self._added_split is None or not any(c in text for c in self._first_chars):
            return self._encode_piece(text)
        ids, start = [], 0
        for match in self._added_split.finditer(text):
            if match.start() > start:
                ids += self._encode_piece(text[start : match.start()])
            ids.append(self.added[match.group()])
            start = match.end()
        if start < len(text):
            ids += self._encode_piece(text[start:])
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text."""
        return [self.encode(text) for text in texts]

    def tiles(self, text: str) -> bool:
        """Whether the tokens of ``text`` tile its UTF-8 bytes (not when NFC normalisation changes the text)."""
        return not self._nfc or text.isascii() or unicodedata.is_normalized("NFC", text)

    def agrees_with(self, tokenizer: Any, texts: list[str]) -> bool:
        """Whether the engine gives ``tokenizer``'s ids on ``texts`` (logs a warning when not)."""
        theirs = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        for text, mine, reference in zip(texts, self.encode_batch(texts), theirs):
            if mine != reference:
                _log.warning(
                    f"tiktoken and tokenizers disagree on {text[:60]!r}: this tokenizer.json is encoded with "
                    "tokenizers (slower) from now on."
                )
                return False
        return True
