"""A small deterministic tokenizer implementing tune.data.ModelTokenizer, for testing the dataset plumbing.

Byte-level: id = byte + 3; 0 pad, 1 BOS, 2 EOS; one header token per role and an end-of-turn token. A conversation
is ``BOS (header content END)* EOS``; every token of a turn, header and END included, carries the turn's mask,
BOS the first turn's and EOS the last turn's. Being a test fixture, it is written to be obviously right, not fast.
"""

import json
from pathlib import Path

import pytest

from tune.data import Message

HEADERS = {"system": 259, "user": 260, "assistant": 261, "tool": 262, "ipython": 262}
END_OF_TURN = 263


class ByteTokenizer:
    bos_id, eos_id, pad_id = 1, 2, 0
    stop_tokens = [2, END_OF_TURN]

    def __init__(self, max_seq_len: int | None = None, call_log: str | None = None) -> None:
        self.max_seq_len = max_seq_len
        self.call_log = call_log  # when set, every tokenize call appends one byte to this file

    def _count_call(self) -> None:
        if self.call_log is not None:
            with open(self.call_log, "a") as f:
                f.write("x")

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        self._count_call()
        ids = [b + 3 for b in text.encode("utf-8")]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        names = {1: "<s>", 2: "</s>", 0: "<pad>", END_OF_TURN: "<end>"}
        names.update({v: f"<{k}>" for k, v in HEADERS.items() if k != "ipython"})
        out, buf = [], bytearray()
        for t in token_ids:
            if 3 <= t < 259:
                buf.append(t - 3)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                out.append(names[t])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def tokenize_messages(self, messages: list[Message], *, add_end_tokens: bool = True):
        self._count_call()
        tokens, mask = [self.bos_id], [messages[0].masked]
        for m in messages:
            turn = [HEADERS[m.role]] + [b + 3 for b in m.content.encode("utf-8")] + [END_OF_TURN] * m.eot
            tokens += turn
            mask += [m.masked] * len(turn)
        if add_end_tokens:
            tokens.append(self.eos_id)
            mask.append(messages[-1].masked)
        if self.max_seq_len is not None:
            tokens, mask = tokens[: self.max_seq_len], mask[: self.max_seq_len]
        return tokens, mask


def byte_ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8")]


@pytest.fixture
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer(max_seq_len=None)


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    """A fresh Hugging Face datasets cache per test, so tests never share cached tokenisations."""
    path = tmp_path / "hf_cache"
    path.mkdir()
    return str(path)


@pytest.fixture
def write_json(tmp_path: Path):
    def write(rows: list[dict], name: str = "data.json") -> str:
        path = tmp_path / name
        path.write_text(json.dumps(rows))
        return str(path)

    return write


@pytest.fixture(scope="session")
def sentencepiece_path(tmp_path_factory) -> str:
    """A tiny BPE SentencePiece model with Llama 2's special ids (unk 0, bos 1, eos 2), trained in a second."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = "the a an of to answer question explain add numbers hello world task input response why how".split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice([".", "?", ":"])
             for _ in range(2000)]  # fmt: skip
    prefix = tmp_path_factory.mktemp("sp") / "tokenizer"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=400, model_type="bpe",
        byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    return f"{prefix}.model"
