"""Dataset files that do not parse (JSON, JSON Lines, CSV, Parquet): one DatasetError naming the file and, where the
parser says, the line."""

import pytest

from tune.datasets._hf import DatasetError, load_source
from tune.utils import TuneError

BAD_FILES = {
    "bad.json": ('[{"a": "x"},\n {"a": \n', r"is not valid JSON or JSON Lines: line 3"),
    "bad.jsonl": ('{"a": "x"}\n{"a": "y"}\n{"a": \n{"a": "z"}\n', r"is not valid JSON or JSON Lines: line 3"),
    "bad.csv": ("a,b\n1,2\n3,4,5\n", r"as CSV: ParserError: .*line 3"),
    "bad.parquet": ("PAR1 this is not parquet", r"as Parquet: ArrowInvalid: .*magic bytes"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_unparseable_file_names_it(tmp_path, monkeypatch, name):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    text, expected = BAD_FILES[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DatasetError, match=expected) as info:
        load_source(str(path), split="train")
    assert str(path) in str(info.value) and isinstance(info.value, TuneError)
    assert "\n" not in str(info.value)
