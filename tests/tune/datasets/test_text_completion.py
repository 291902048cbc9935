import logging

import pytest

from tests.tune.datasets._helpers import ByteTokenizer, byte_ids
from tune.datasets import PackedDataset, TextCompletionDataset, text_completion_dataset


def test_text_file_lines_with_eos_and_blank_lines_dropped(tmp_path, cache_dir, caplog):
    path = tmp_path / "corpus.txt"
    path.write_text("first line\n\nsecond\n")
    with caplog.at_level(logging.INFO, logger="tune"):
        ds = text_completion_dataset(ByteTokenizer(), source="text", data_files=str(path), cache_dir=cache_dir)
    assert isinstance(ds, TextCompletionDataset) and len(ds) == 2
    assert ds[0]["tokens"] == [1, *byte_ids("first line"), 2]
    assert ds[1]["labels"] == ds[1]["tokens"] == [1, *byte_ids("second"), 2]
    assert "dropped 1 rows with blank 'text'" in caplog.text


def test_no_eos_and_custom_column(write_json, cache_dir):
    ds = text_completion_dataset(ByteTokenizer(), source="json", data_files=write_json([{"body": "abc"}]),
                                 cache_dir=cache_dir, column="body", add_eos=False)  # fmt: skip
    assert ds[0]["tokens"] == [1, *byte_ids("abc")]


def test_truncation_counted_and_packing_splits_across_packs(write_json, cache_dir):
    tok = ByteTokenizer(max_seq_len=8)
    rows = [{"text": "x" * 20}, {"text": "abc"}]
    plain = text_completion_dataset(tok, source="json", data_files=write_json(rows), cache_dir=cache_dir)
    assert plain.num_truncated == 1 and plain[0]["tokens"] == [1] + byte_ids("x" * 7)
    packed = text_completion_dataset(tok, source="json", data_files=write_json(rows), cache_dir=cache_dir,
                                     packed=True)  # fmt: skip
    assert isinstance(packed, PackedDataset)
    # 8 tokens of doc 0, then doc 1 (5 tokens) fills 5 of the next pack: no token lost, last pack padded
    assert len(packed) == 2 and packed[1]["seq_lens"].tolist() == [5, 3]


def test_non_string_text_names_row(write_json, cache_dir):
    with pytest.raises(ValueError, match="row 1: column 'text' must hold a string"):
        text_completion_dataset(ByteTokenizer(), source="json", data_files=write_json([{"text": "a"}, {"text": None}]),
                                cache_dir=cache_dir)  # fmt: skip


def test_all_blank_is_an_error(write_json, cache_dir):
    with pytest.raises(ValueError, match="empty 'text'"):
        TextCompletionDataset(ByteTokenizer(), "json", data_files=write_json([{"text": " "}]), cache_dir=cache_dir)


def test_missing_column(write_json, cache_dir):
    with pytest.raises(ValueError, match=r"Expected columns: \['text'\]; available: \['content'\]"):
        text_completion_dataset(ByteTokenizer(), source="json", data_files=write_json([{"content": "a"}]),
                                cache_dir=cache_dir)  # fmt: skip
