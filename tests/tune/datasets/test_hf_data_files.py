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


# ---- local JSON files are loaded by tune itself (tune.datasets._hf._load_local_json): same table as datasets' ------

GOOD_FILES = {
    "rows.json": '[{"instruction": "a", "input": "", "output": "x"},\n'
    ' {"instruction": "b", "input": "i", "output": "y"}]',
    "rows.jsonl": '{"instruction": "a", "output": "x"}\n\n{"instruction": "b", "input": "i", "output": "y"}\n',
    "nested.jsonl": '{"messages": [{"role": "user", "content": "hi"}], "n": 1}\n{"messages": [], "n": 2.5}\n',
    "bom.json": '\ufeff[{"text": "a"}, {"text": null}]',
}


@pytest.mark.parametrize("name", GOOD_FILES)
def test_local_json_loads_as_datasets_does(tmp_path, name):
    import datasets

    path = tmp_path / name
    path.write_text(GOOD_FILES[name], encoding="utf-8")
    ours = load_source("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "ours"))
    assert ours.cache_files[0]["filename"].startswith(str(tmp_path / "ours" / "tune_json"))  # the fast path ran
    theirs = datasets.load_dataset("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "theirs"))
    assert ours.column_names == theirs.column_names and ours.features == theirs.features
    assert ours.to_list() == theirs.to_list()
    # a second load maps the same file (no parsing); a changed file is parsed afresh
    again = load_source("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "ours"))
    assert again.cache_files == ours.cache_files and again._fingerprint == ours._fingerprint
    path.write_text(GOOD_FILES[name].replace("a", "A"), encoding="utf-8")
    changed = load_source("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "ours"))
    assert changed._fingerprint != ours._fingerprint and changed.to_list() != ours.to_list()


def test_local_json_with_mixed_types_is_left_to_datasets(tmp_path):
    # a column that is text in one row and a number in another: pyarrow cannot type it, so datasets' builder
    # loads the file (its rules: here, the number as text) and tune writes nothing of its own
    import datasets

    path = tmp_path / "mixed.json"
    path.write_text('[{"a": "x"}, {"a": 1}]')
    ours = load_source(str(path), split="train", cache_dir=str(tmp_path / "cache"))
    theirs = datasets.load_dataset("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "theirs"))
    assert ours.to_list() == theirs.to_list()
    assert not list((tmp_path / "cache").glob("tune_json/*"))


@pytest.mark.parametrize("split", ["train[:1]", "train[50%:]", "validation"])
def test_local_json_split_names_and_slices_are_datasets_own(tmp_path, split):
    # a slice of the split, or a split the files do not have: datasets' own answer, not the whole file
    import datasets

    path = tmp_path / "rows.json"
    path.write_text(GOOD_FILES["rows.json"])
    try:
        expected = datasets.load_dataset("json", split=split, data_files=str(path), cache_dir=str(tmp_path / "theirs"))
    except Exception as err:  # the split does not exist: tune says so too (naming the split)
        with pytest.raises(DatasetError, match=split.split("[")[0]):
            load_source("json", split=split, data_files=str(path), cache_dir=str(tmp_path / "ours"))
        assert "split" in str(err).lower()
        return
    ours = load_source("json", split=split, data_files=str(path), cache_dir=str(tmp_path / "ours"))
    assert ours.to_list() == expected.to_list() and len(ours) == 1


def test_local_json_with_dates_keeps_datasets_types(tmp_path):
    # datasets (pyarrow's JSON reader) reads ISO dates as timestamps: such a file is left to it
    import datasets

    path = tmp_path / "dated.jsonl"
    path.write_text('{"when": "2024-01-01T10:00:00", "text": "a"}\n{"when": "2024-01-02T10:00:00", "text": "b"}\n')
    ours = load_source("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "ours"))
    theirs = datasets.load_dataset("json", split="train", data_files=str(path), cache_dir=str(tmp_path / "theirs"))
    assert ours.features == theirs.features and ours.to_list() == theirs.to_list()
