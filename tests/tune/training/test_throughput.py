"""Token counting, throughput windows, precision helpers and the progress bar."""

import time

import pytest
import torch
from torch import nn

from tune.training import (
    ThroughputTracker,
    count_tokens,
    get_dtype,
    get_progress_bar,
    set_default_dtype,
    validate_expected_param_dtype,
)


def test_count_tokens_skips_padding():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 0]])
    assert count_tokens(tokens, pad_id=0).item() == 5
    assert count_tokens(tokens).item() == 8


def test_throughput_tracker_reports_a_window_and_resets():
    tracker = ThroughputTracker()
    tracker.update(count_tokens(torch.ones(2, 50)))
    tracker.update(100)
    time.sleep(0.05)
    stats = tracker.compute()
    assert stats["num_tokens"] == 200
    # 200 tokens over at least 0.05 s
    assert 0 < stats["tokens_per_second"] <= 200 / 0.05
    assert tracker.compute()["num_tokens"] == 0


def test_progress_bar_is_hidden_off_rank_zero(monkeypatch):
    bar = get_progress_bar(total=10, epoch=0)
    assert not bar.disable
    bar.close()
    monkeypatch.setenv("RANK", "1")
    bar = get_progress_bar(total=10, epoch=0)
    assert bar.disable
    bar.close()


def test_set_default_dtype_builds_modules_in_that_dtype():
    with set_default_dtype(torch.bfloat16):
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32
    validate_expected_param_dtype(layer.named_parameters(), torch.bfloat16)
    with pytest.raises(ValueError, match="weight"):
        validate_expected_param_dtype(layer.named_parameters(), torch.float32)
    assert get_dtype("bf16") == torch.bfloat16
