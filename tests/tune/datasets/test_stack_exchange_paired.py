import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import stack_exchange_paired_dataset


def _rows():
    # lvwerra/stack-exchange-paired's columns
    return [{"qid": 1, "question": "How?", "date": "2010/01/01", "metadata": ["x"], "response_j": "Good.",
             "response_k": "Bad."}]  # fmt: skip


def test_question_with_chosen_and_rejected_answers(write_json, cache_dir):
    ds = stack_exchange_paired_dataset(ByteTokenizer(), source="json", data_files=write_json(_rows()),
                                       cache_dir=cache_dir)  # fmt: skip
    prompt = [1, HEADERS["user"], *byte_ids("How?"), END_OF_TURN]
    good = [HEADERS["assistant"], *byte_ids("Good."), END_OF_TURN, 2]
    bad = [HEADERS["assistant"], *byte_ids("Bad."), END_OF_TURN, 2]
    sample = ds[0]
    assert sample["chosen_input_ids"] == prompt + good
    assert sample["chosen_labels"] == [-100] * len(prompt) + good
    assert sample["rejected_input_ids"] == prompt + bad
    assert sample["rejected_labels"] == [-100] * len(prompt) + bad


def test_unknown_column_map_key(write_json, cache_dir):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['answer'\]"):
        stack_exchange_paired_dataset(ByteTokenizer(), source="json", data_files=write_json(_rows()),
                                      cache_dir=cache_dir, column_map={"answer": "response_j"})  # fmt: skip
