import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import PreferenceDataset, hh_rlhf_helpful_dataset


def test_chosen_and_rejected_conversations(write_json, cache_dir):
    # RLHFlow/HH-RLHF-Helpful-standard's columns: OpenAI-style turns
    prompt = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Help?"},
    ]
    row = {"chosen": prompt + [{"role": "assistant", "content": "Sure."}],
           "rejected": prompt + [{"role": "assistant", "content": "No."}]}  # fmt: skip
    ds = hh_rlhf_helpful_dataset(ByteTokenizer(), source="json", data_files=write_json([row]), cache_dir=cache_dir)
    user_1 = [1, HEADERS["user"], *byte_ids("Hi"), END_OF_TURN]
    answer_1 = [HEADERS["assistant"], *byte_ids("Hello"), END_OF_TURN]
    user_2 = [HEADERS["user"], *byte_ids("Help?"), END_OF_TURN]
    head = user_1 + answer_1 + user_2
    sure = [HEADERS["assistant"], *byte_ids("Sure."), END_OF_TURN, 2]
    sample = ds[0]
    assert sample["chosen_input_ids"] == head + sure
    assert sample["rejected_input_ids"] == head + [HEADERS["assistant"], *byte_ids("No."), END_OF_TURN, 2]
    # every assistant turn is trained (the default strategy), the user turns are not
    masked = [-100] * len(user_1)
    assert sample["chosen_labels"] == masked + answer_1 + [-100] * len(user_2) + sure


def test_preference_dataset_refuses_packing():
    with pytest.raises(ValueError, match="packed=True is not supported for preference datasets"):
        PreferenceDataset(source="json", message_transform=None, tokenizer=ByteTokenizer(), packed=True)
