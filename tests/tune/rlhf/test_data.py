"""Tests of tune/rlhf/_data.py: what the preference and GRPO recipes require of their data."""

import pytest

from tune.rlhf import PREFERENCE_KEYS, check_preference_dataset, check_prompt_dataset


def test_preference_pairs_pass():
    pair = {key: [1, 2] for key in PREFERENCE_KEYS}
    check_preference_dataset([pair, pair])
    check_preference_dataset([{**pair, "extra": 0}])  # more keys are fine


def test_sft_samples_are_refused_naming_the_keys_and_the_builder():
    with pytest.raises(ValueError) as error:
        check_preference_dataset([{"tokens": [1], "labels": [1]}])
    message = str(error.value)
    assert "['labels', 'tokens']" in message and "chosen_input_ids" in message
    assert "tune.datasets.preference_dataset" in message


def test_an_empty_dataset_is_refused():
    with pytest.raises(ValueError, match="gives samples with keys \\[\\]"):
        check_preference_dataset([])


def test_prompt_rows_pass_and_sft_samples_are_refused_naming_the_builders():
    check_prompt_dataset([{"tokens": [1, 2], "prompt": "3 + 4 =", "answer": "7"}])
    check_prompt_dataset([])  # nothing to check: the recipe reports an empty data loader itself
    with pytest.raises(ValueError) as error:
        check_prompt_dataset([{"tokens": [1], "labels": [1]}])
    message = str(error.value)
    assert "['labels', 'tokens']" in message and "'prompt'" in message
    assert "tune.datasets.prompt_dataset" in message
