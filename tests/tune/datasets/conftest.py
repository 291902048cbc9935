"""Fixtures of the dataset tests (the helpers they use live in ``_helpers.py``)."""

import json
from pathlib import Path

import pytest

from tests.tune.datasets._helpers import ByteTokenizer


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
