"""Samples left without a loss token (a prompt cut off before its answer) are counted and warned about at setup."""

import logging

from tests.tune.datasets._helpers import ByteTokenizer
from tune.data import InputOutputToMessages
from tune.datasets import SFTDataset, preference_dataset


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _sft(data_files: str, cache_dir: str) -> SFTDataset:
    return SFTDataset(
        source="json",
        data_files=data_files,
        cache_dir=cache_dir,
        message_transform=InputOutputToMessages(),
        model_transform=ByteTokenizer(max_seq_len=16),
    )


def test_sft_samples_cut_before_their_answer_are_a_warning_with_their_count(write_json, cache_dir, caplog):
    rows = [{"input": "q", "output": "short"}, {"input": "q" * 50, "output": "long answer"},
            {"input": "q" * 40, "output": "a"}, {"input": "q", "output": "x" * 40}]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="tune"):
        ds = _sft(write_json(rows), cache_dir)
    # the expected count from the samples themselves: rows 1 and 2 are cut inside their prompt
    untrained = [i for i in range(len(ds)) if all(label == -100 for label in ds[i]["labels"])]
    assert untrained == [1, 2]
    (warning,) = _warnings(caplog)
    assert "2 of 4 samples have no loss token after truncation to max_seq_len=16; they train nothing" in warning
    assert "tokenizer.max_seq_len" in warning and "train_on_input" in warning


def test_no_warning_when_every_sample_keeps_a_loss_token(write_json, cache_dir, caplog):
    rows = [{"input": "q", "output": "short"}, {"input": "q", "output": "x" * 40}]  # the second is cut in its answer
    with caplog.at_level(logging.INFO, logger="tune"):
        _sft(write_json(rows), cache_dir)
    assert "1 truncated to max_seq_len=16" in caplog.text
    assert _warnings(caplog) == []


def test_preference_pairs_with_a_side_cut_before_its_answer_are_counted(write_json, cache_dir, caplog):
    def row(question, good, bad):
        prompt = [{"role": "user", "content": question}]
        return {"chosen": prompt + [{"role": "assistant", "content": good}],
                "rejected": prompt + [{"role": "assistant", "content": bad}]}  # fmt: skip

    rows = [row("Q", "good", "bad"), row("Q" * 30, "good", "bad"), row("Q", "good", "bad")]
    with caplog.at_level(logging.INFO, logger="tune"):
        ds = preference_dataset(ByteTokenizer(max_seq_len=20), source="json", data_files=write_json(rows),
                                cache_dir=cache_dir)  # fmt: skip
    assert all(label == -100 for label in ds[1]["chosen_labels"])
    (warning,) = _warnings(caplog)
    assert "1 of 3 samples have no loss token after truncation to max_seq_len=20" in warning
