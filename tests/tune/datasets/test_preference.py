import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.data import padded_collate_dpo
from tune.datasets import preference_dataset


def _row(answer_good, answer_bad):
    prompt = [{"role": "user", "content": "Q"}]
    return {"chosen": prompt + [{"role": "assistant", "content": answer_good}],
            "rejected": prompt + [{"role": "assistant", "content": answer_bad}]}  # fmt: skip


def test_chosen_and_rejected_tokens_and_labels(write_json, cache_dir):
    ds = preference_dataset(ByteTokenizer(), source="json", data_files=write_json([_row("good", "bad")]),
                            cache_dir=cache_dir)  # fmt: skip
    sample = ds[0]
    prompt = [1, HEADERS["user"], *byte_ids("Q"), END_OF_TURN]
    good = [HEADERS["assistant"], *byte_ids("good"), END_OF_TURN, 2]
    bad = [HEADERS["assistant"], *byte_ids("bad"), END_OF_TURN, 2]
    assert sample["chosen_input_ids"] == prompt + good
    assert sample["chosen_labels"] == [-100] * len(prompt) + good
    assert sample["rejected_input_ids"] == prompt + bad
    assert sample["rejected_labels"] == [-100] * len(prompt) + bad
    tokens, labels = padded_collate_dpo([sample])
    assert tokens.shape == (2, len(prompt) + len(good))


def test_bad_pair_names_row(write_json, cache_dir):
    with pytest.raises(ValueError, match="row 1: column 'rejected', turn 1: content is empty"):
        preference_dataset(ByteTokenizer(), source="json", data_files=write_json([_row("a", "b"), _row("a", "")]),
                           cache_dir=cache_dir)  # fmt: skip
