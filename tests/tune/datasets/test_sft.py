"""The tokenisation pipeline shared by the builders: caching, processes, errors, truncation."""

import logging
import os

import pytest

from tests.tune.datasets._helpers import ByteTokenizer, byte_ids
from tune.data import InputOutputToMessages
from tune.datasets import SFTDataset, instruct_dataset


def _rows(n: int) -> list[dict]:
    return [{"input": f"question {i}", "output": f"answer {i}"} for i in range(n)]


def _calls(path) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


class TestCache:
    def test_second_run_does_not_retokenize(self, tmp_path, write_json, cache_dir):
        data, log = write_json(_rows(40)), str(tmp_path / "calls")
        first = instruct_dataset(ByteTokenizer(call_log=log), source="json", data_files=data, cache_dir=cache_dir)
        calls_first = _calls(log)
        assert calls_first >= 40  # every row went through the tokenizer once
        second = instruct_dataset(ByteTokenizer(call_log=log), source="json", data_files=data, cache_dir=cache_dir)
        assert _calls(log) == calls_first, "the second run tokenised again instead of reading the cache"
        assert [second[i] for i in range(40)] == [first[i] for i in range(40)]

    @pytest.mark.parametrize(
        "change",
        [{"train_on_input": True}, {"new_system_prompt": "Be kind."}, {"tokenizer_max_seq_len": 20}],
    )
    def test_changed_setting_retokenizes(self, tmp_path, write_json, cache_dir, change):
        data, log = write_json(_rows(10)), str(tmp_path / "calls")
        instruct_dataset(ByteTokenizer(call_log=log), source="json", data_files=data, cache_dir=cache_dir)
        before = _calls(log)
        change = dict(change)
        tok = ByteTokenizer(max_seq_len=change.pop("tokenizer_max_seq_len", None), call_log=log)
        instruct_dataset(tok, source="json", data_files=data, cache_dir=cache_dir, **change)
        assert _calls(log) >= before + 10

    def test_changed_data_retokenizes(self, tmp_path, write_json, cache_dir):
        log = str(tmp_path / "calls")
        data = write_json(_rows(10))
        instruct_dataset(ByteTokenizer(call_log=log), source="json", data_files=data, cache_dir=cache_dir)
        before = _calls(log)
        rows = _rows(10)
        rows[3]["output"] = "a different answer"
        ds = instruct_dataset(
            ByteTokenizer(call_log=log), source="json", data_files=write_json(rows, "changed.json"), cache_dir=cache_dir
        )
        assert _calls(log) >= before + 10
        assert ds[3]["tokens"][-len("a different answer") - 2 : -2] == byte_ids("a different answer")


def test_processes_give_the_same_result(write_json, cache_dir, tmp_path):
    data = write_json(_rows(300))
    one = instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir, num_proc=1)
    two = instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=str(tmp_path), num_proc=2)
    assert [one[i] for i in range(len(one))] == [two[i] for i in range(len(two))]


class TestBadInput:
    def test_missing_column_names_expected_and_available(self, write_json, cache_dir):
        data = write_json([{"question": "q", "output": "a"}])
        with pytest.raises(ValueError, match=r"no column\(s\) \['input'\].*Expected columns: \['input', 'output'\]; "
                                             r"available: \['question', 'output'\]"):  # fmt: skip
            instruct_dataset(ByteTokenizer(), source="json", data_files=data, cache_dir=cache_dir)

    @pytest.mark.parametrize(
        "bad, match",
        [("", "row 2: column 'output' is empty"), (None, "row 2: column 'output' must hold a string, got NoneType")],
    )
    def test_bad_message_names_row_index(self, write_json, cache_dir, bad, match):
        rows = _rows(4)
        rows[2]["output"] = bad
        with pytest.raises(ValueError, match=match):
            instruct_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir)

    def test_bad_row_in_worker_process_names_row_index(self, write_json, cache_dir):
        rows = _rows(60)
        rows[47]["output"] = "   "
        with pytest.raises(ValueError, match="row 47: column 'output' is empty"):
            instruct_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
                             num_proc=2)  # fmt: skip

    def test_empty_after_filter_is_an_error(self, write_json, cache_dir):
        with pytest.raises(ValueError, match="filter_fn removed all 5 rows"):
            instruct_dataset(ByteTokenizer(), source="json", data_files=write_json(_rows(5)), cache_dir=cache_dir,
                             filter_fn=lambda row: False)  # fmt: skip

    def test_filter_keeps_matching_rows(self, write_json, cache_dir):
        ds = instruct_dataset(ByteTokenizer(), source="json", data_files=write_json(_rows(6)), cache_dir=cache_dir,
                              filter_fn=lambda row: row["input"].endswith(("1", "4")))  # fmt: skip
        assert len(ds) == 2 and ds[1]["tokens"][2 : 2 + 10] == byte_ids("question 4")

    def test_unknown_source_is_actionable(self, cache_dir):
        with pytest.raises(ValueError, match="Could not load dataset source"):
            instruct_dataset(ByteTokenizer(), source="json", data_files="/nonexistent/file.json", cache_dir=cache_dir)


def test_over_long_samples_are_truncated_and_counted(write_json, cache_dir, caplog):
    rows = [{"input": "q", "output": "short"}, {"input": "q" * 50, "output": "long answer"},
            {"input": "q", "output": "x" * 40}]  # fmt: skip
    tok = ByteTokenizer(max_seq_len=16)
    with caplog.at_level(logging.INFO, logger="tune"):
        ds = SFTDataset(source="json", data_files=write_json(rows), cache_dir=cache_dir,
                        message_transform=InputOutputToMessages(), model_transform=tok)  # fmt: skip
    assert ds.num_truncated == 2
    assert "2 truncated to max_seq_len=16" in caplog.text
    # BOS, <user> q <end>, <assistant> short <end>, EOS
    assert [len(ds[i]["tokens"]) for i in range(3)] == [1 + 3 + 7 + 1, 16, 16]
    # a cut sample still ends in EOS, which gets no loss (the text did not end there), as tune.data.truncate does
    assert ds[2]["tokens"][-1] == tok.eos_id and ds[2]["labels"][-1] == -100
    assert ds[2]["labels"][-2] == ds[2]["tokens"][-2] != -100  # the answer before it is trained
    assert ds[1]["labels"] == [-100] * 16  # cut inside the masked prompt


def test_automatic_process_count():
    from tune.datasets._hf import resolve_num_proc

    assert resolve_num_proc(None, 500) == 1  # small data: starting workers costs more than it saves
    assert resolve_num_proc(3, 500) == 3  # an explicit count is kept
    assert 1 <= resolve_num_proc(None, 1_000_000) <= 8
    with pytest.raises(ValueError, match="num_proc must be >= 1"):
        resolve_num_proc(0, 10)
