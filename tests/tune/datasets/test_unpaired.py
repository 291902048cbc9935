"""unpaired_preference_dataset, unpaired_from_pairs, the KL rows and padded_collate_kto."""

import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.data import padded_collate_kto
from tune.datasets import (
    UnpairedPreferenceDataset,
    kl_partner_index,
    unpaired_from_pairs,
    unpaired_preference_dataset,
)


def _prompt(text):
    return [1, HEADERS["user"], *byte_ids(text), END_OF_TURN]


def _completion(text):
    return [HEADERS["assistant"], *byte_ids(text), END_OF_TURN, 2]


def test_messages_and_strings_tokenise_as_prompt_then_trained_completion(write_json, cache_dir):
    rows = [
        {"prompt": [{"role": "user", "content": "Q1"}], "completion": [{"role": "assistant", "content": "A1"}],
         "label": True},
        {"prompt": [{"role": "user", "content": "Q2"}], "completion": [{"role": "assistant", "content": "B2"}],
         "label": False},
    ]  # fmt: skip
    data = unpaired_preference_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir)
    as_strings = unpaired_preference_dataset(
        ByteTokenizer(), source="json", cache_dir=cache_dir,
        data_files=write_json([{"prompt": "Q1", "completion": "A1", "label": True}], "strings.json"),
    )  # fmt: skip
    first = data[0]
    assert first["input_ids"] == _prompt("Q1") + _completion("A1") == as_strings[0]["input_ids"]
    assert first["labels"] == [-100] * len(_prompt("Q1")) + _completion("A1")
    assert first["label"] is True and data[1]["label"] is False
    assert "kl_input_ids" not in first  # no kl_group_size: no KL rows


def test_kl_partners_rotate_within_groups_as_trl():
    # TRL's add_kl_completion_ids over batches of per_device_train_batch_size: [c[-1]] + c[:-1] in each batch
    completions = list(range(10))
    expected = []
    for start in range(0, 10, 4):
        group = completions[start : start + 4]
        expected += [group[-1], *group[:-1]]
    assert [kl_partner_index(i, 10, 4) for i in range(10)] == expected == [3, 0, 1, 2, 7, 4, 5, 6, 9, 8]
    assert [kl_partner_index(i, 3, 1) for i in range(3)] == [0, 1, 2]


def test_kl_row_is_the_prompt_with_the_partners_completion(write_json, cache_dir):
    rows = [{"prompt": f"Q{i}", "completion": f"A{i}" * (i + 1), "label": i % 2 == 0} for i in range(5)]
    data = unpaired_preference_dataset(
        ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir, kl_group_size=2
    )
    for index, partner in enumerate([1, 0, 3, 2, 4]):
        sample = data[index]
        assert sample["kl_input_ids"] == _prompt(f"Q{index}") + _completion(f"A{partner}" * (partner + 1))
        assert sample["kl_labels"] == [-100] * len(_prompt(f"Q{index}")) + _completion(f"A{partner}" * (partner + 1))


def test_pairs_become_blocks_of_chosen_then_rejected(write_json, cache_dir):
    pairs = [
        {"chosen": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"good{i}"}],
         "rejected": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"bad{i}"}]}
        for i in range(5)
    ]  # fmt: skip
    data = unpaired_from_pairs(
        ByteTokenizer(), source="json", data_files=write_json(pairs), cache_dir=cache_dir, kl_group_size=4
    )
    assert len(data) == 10
    order = [(sample["input_ids"], sample["label"]) for sample in (data[i] for i in range(10))]
    expected = []
    for block in ([0, 1], [2, 3], [4]):
        expected += [(_prompt(f"Q{i}") + _completion(f"good{i}"), True) for i in block]
        expected += [(_prompt(f"Q{i}") + _completion(f"bad{i}"), False) for i in block]
    assert order == expected
    for index in range(8):  # in full groups no prompt gets its own pair's completion as its KL row
        sample = data[index]
        prompt_length = len(_prompt("Q0"))
        assert sample["kl_input_ids"][:prompt_length] == sample["input_ids"][:prompt_length]
        partner = data[kl_partner_index(index, 10, 4)]
        assert partner["input_ids"][:prompt_length] != sample["input_ids"][:prompt_length]
    with pytest.raises(ValueError, match="even kl_group_size >= 4"):
        unpaired_from_pairs(ByteTokenizer(), source="json", data_files=write_json(pairs), kl_group_size=2)


def test_a_multi_turn_prompt_trains_only_the_final_assistant_turn(write_json, cache_dir):
    prompt = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "Q"},
    ]
    rows = [{"prompt": prompt, "completion": "A", "label": True}]
    (sample,) = unpaired_preference_dataset(
        ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir
    )
    trained = [label for label in sample["labels"] if label != -100]
    assert trained == _completion("A")


def test_bad_rows_name_the_row_and_the_fix(write_json, cache_dir):
    rows = [{"prompt": "Q", "completion": "A", "label": True}, {"prompt": "Q", "completion": "A", "label": "yes"}]
    with pytest.raises(ValueError, match="row 1.*column 'label' must hold True or False"):
        unpaired_preference_dataset(ByteTokenizer(), source="json", data_files=write_json(rows), cache_dir=cache_dir)
    with pytest.raises(ValueError, match="no column"):
        unpaired_preference_dataset(
            ByteTokenizer(), source="json", data_files=write_json([{"prompt": "Q", "completion": "A"}], "b.json"),
            cache_dir=cache_dir,
        )  # fmt: skip
    with pytest.raises(ValueError, match="kl_group_size must be >= 1"):
        UnpairedPreferenceDataset([], kl_group_size=0)


def test_collate_pads_examples_flags_and_kl_rows():
    examples = [
        {"input_ids": [1, 5, 6], "labels": [-100, 5, 6], "label": True},
        {"input_ids": [1, 7, 8, 9, 10], "labels": [-100, -100, 8, 9, 10], "label": False},
    ]
    batch = padded_collate_kto(UnpairedPreferenceDataset(examples, kl_group_size=2), padding_idx=0)
    assert batch["tokens"].tolist() == [[1, 5, 6, 0, 0], [1, 7, 8, 9, 10]]
    assert batch["labels"].tolist() == [[-100, 5, 6, -100, -100], [-100, -100, 8, 9, 10]]
    assert batch["desirable"].tolist() == [True, False]
    assert batch["kl_tokens"].tolist() == [[1, 8, 9, 10], [1, 7, 5, 6]]
    assert batch["kl_labels"].tolist() == [[-100, 8, 9, 10], [-100, -100, 5, 6]]
    assert "kl_tokens" not in padded_collate_kto(examples)
