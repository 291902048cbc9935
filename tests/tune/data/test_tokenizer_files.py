"""Tokenizer files that are missing or are not the kind of tokenizer asked for: one TuneError naming the file.

Each builder is given a path that does not exist and a file of the wrong kind (no tokenizer needs training here).
"""

from pathlib import Path

import pytest

from tune.data._tokenizers import (
    HuggingFaceBaseTokenizer,
    SentencePieceBaseTokenizer,
    TokenizerFileError,
    TokenizerFileNotFoundError,
)
from tune.models.llama3 import llama3_tokenizer
from tune.models.qwen2_5 import qwen2_5_tokenizer
from tune.utils import TuneError

BUILDERS = {
    "sentencepiece": (SentencePieceBaseTokenizer, "tokenizer.model", "is not a valid SentencePiece model"),
    "tiktoken": (llama3_tokenizer, "tokenizer.model", "is not a tiktoken BPE line"),
    "tokenizer_json": (HuggingFaceBaseTokenizer, "tokenizer.json", "is not a valid Hugging Face tokenizer.json"),
    "qwen_tokenizer_json": (qwen2_5_tokenizer, "tokenizer.json", "is not a valid Hugging Face tokenizer.json"),
}


@pytest.mark.parametrize("kind", BUILDERS)
def test_missing_file_names_it(tmp_path, kind):
    build, name, _ = BUILDERS[kind]
    path = tmp_path / "nowhere" / name
    with pytest.raises(TokenizerFileNotFoundError, match="not found at") as info:
        build(str(path))
    assert str(path) in str(info.value) and isinstance(info.value, (TuneError, FileNotFoundError))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", BUILDERS)
def test_file_of_another_kind_names_it(tmp_path, kind):
    build, name, expected = BUILDERS[kind]
    path = tmp_path / name
    path.write_text("this is not a tokenizer\n")  # also not JSON, not base64
    with pytest.raises(TokenizerFileError, match=expected) as info:
        build(str(path))
    assert str(path) in str(info.value) and isinstance(info.value, TuneError)
    assert "\n" not in str(info.value)


def test_empty_tiktoken_file(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(b"")
    with pytest.raises(TokenizerFileError, match="holds no tokens"):
        llama3_tokenizer(str(path))


def test_tokenizer_config_that_is_not_json_names_it(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": ')
    with pytest.raises(TokenizerFileError, match=r"tokenizer_config.json .* is not valid JSON \(line 1"):
        HuggingFaceBaseTokenizer(tmp_path)


def test_directory_where_a_file_is_expected(tmp_path):
    with pytest.raises(TokenizerFileNotFoundError, match="is a directory"):
        SentencePieceBaseTokenizer(Path(tmp_path))
