"""SentencePiece tokenizer (``tokenizer.model`` of the Llama 2, Mistral, Gemma and Phi-3 families)."""

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from tune.data._chat_formats import Segment
from tune.data._tokenizers._utils import encode_chunked, require_file


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
        FileNotFoundError: if ``path`` is not a file.
    """

    def __init__(
        self,
        path: "str | Path",
        special_tokens: Mapping[str, int] | None = None,
        rstrip_tokens: Collection[str] = (),
    ) -> None:
        import sentencepiece as spm

        path = require_file(path, "SentencePiece model", "Pass the tokenizer.model file shipped with the model.")
        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self.bos_id: int = self._sp.bos_id()
        self.eos_id: int = self._sp.eos_id()
        self.pad_id: int = self._sp.pad_id() if self._sp.pad_id() >= 0 else 0
        self.special_tokens = dict(special_tokens or {})
        self._extra = {i: t for t, i in self.special_tokens.items() if i >= self._sp.vocab_size()}
        self.vocab_size: int = max([self._sp.vocab_size(), *(i + 1 for i in self._extra)])
        self._rstrip = frozenset(rstrip_tokens)

    def encode(
        self, text: str, add_bos: bool = True, add_eos: bool = True, trim_leading_whitespace: bool = False
    ) -> list[int]:
        """Encodes text.

        Args:
            text (str): the text.
            add_bos (bool): prepend BOS.
            add_eos (bool): append EOS.
            trim_leading_whitespace (bool): drop the dummy prefix, so the text encodes as it would in the middle of
                a longer string.

        Returns:
            list[int]: token ids.
        """
        ids = self._sp.encode(text)
        if trim_leading_whitespace and ids and self._sp.id_to_piece(ids[0]) == "▁":
            ids = ids[1:]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

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
        pieces = self._encode_proto(text).pieces
        return [p.id for p in pieces], [(p.begin, p.end) for p in pieces]

    def _encode_proto(self, text: str):
        try:
            return self._sp.encode(text, return_type="proto")
        except TypeError:  # sentencepiece < 0.2.1
            return self._sp.encode(text, out_type="immutable_proto")

    def encode_segments(self, segments: Sequence[Segment]) -> tuple[list[int], list[bool]]:
        """Tokens of a rendered conversation and whether each is trainable."""
        return encode_chunked(segments, self.token_id, self._sp.encode, self.encode_with_offsets, self._rstrip)
