import pytest

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.datasets import chat_dataset


def _turn(role, text):
    return [HEADERS[role], *byte_ids(text), END_OF_TURN]


def test_sharegpt_multi_turn_masks_only_non_assistant(write_json, cache_dir):
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "U1"}, {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "U2"}, {"from": "gpt", "value": "A2"}]  # fmt: skip
    ds = chat_dataset(ByteTokenizer(), source="json", data_files=write_json([{"conv": conv}]), cache_dir=cache_dir,
                      conversation_column="conv", conversation_style="sharegpt")  # fmt: skip
    masked = lambda ids: [-100] * len(ids)  # noqa: E731
    expected_labels = (
        [-100] + masked(_turn("system", "S")) + masked(_turn("user", "U1")) + _turn("assistant", "A1")
        + masked(_turn("user", "U2")) + _turn("assistant", "A2") + [2]
    )  # fmt: skip
    assert ds[0]["labels"] == expected_labels


def test_openai_style(write_json, cache_dir):
    conv = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    ds = chat_dataset(ByteTokenizer(), source="json", data_files=write_json([{"messages": conv}]),
                      cache_dir=cache_dir, conversation_column="messages", conversation_style="openai",
                      train_on_input=True)  # fmt: skip
    assert ds[0]["labels"] == ds[0]["tokens"] == [1, *_turn("user", "U"), *_turn("assistant", "A"), 2]


def test_bad_turn_names_row_and_turn(write_json, cache_dir):
    good = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    bad = [{"role": "user", "content": "U"}, {"role": "assistant", "content": ""}]
    with pytest.raises(ValueError, match="row 1: column 'messages', turn 1: content is empty"):
        chat_dataset(ByteTokenizer(), source="json", data_files=write_json([{"messages": good}, {"messages": bad}]),
                     cache_dir=cache_dir, conversation_column="messages", conversation_style="openai")  # fmt: skip


def test_unknown_style(write_json, cache_dir):
    with pytest.raises(ValueError, match="conversation_style must be one of"):
        chat_dataset(ByteTokenizer(), source="json", data_files=write_json([{"m": []}]), cache_dir=cache_dir,
                     conversation_column="m", conversation_style="vicuna")  # fmt: skip


def test_masking_strategy_train_on_last(write_json, cache_dir):
    conv = [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "U2"}, {"role": "assistant", "content": "A2"}]  # fmt: skip
    ds = chat_dataset(ByteTokenizer(), source="json", data_files=write_json([{"messages": conv}]), cache_dir=cache_dir,
                      conversation_column="messages", conversation_style="openai",
                      masking_strategy="train_on_last")  # fmt: skip
    trained = [t for t in ds[0]["labels"] if t != -100]
    assert trained == _turn("assistant", "A2") + [2]  # only the last answer (and the final EOS)
