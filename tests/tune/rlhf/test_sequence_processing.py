"""tune/rlhf/_sequence_processing.py: sequence log-probabilities against TRL's, and the trimming of generations."""

import pytest
import torch

from tune.rlhf import (
    get_batch_log_probs,
    get_reward_penalty_mask,
    logits_to_logprobs,
    truncate_sequence_at_first_stop_token,
    truncate_sequence_for_logprobs,
)


def _logits_and_labels(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 17, generator=gen, dtype=dtype) * 3
    labels = torch.randint(0, 17, (4, 9), generator=gen)
    labels[:, :3] = -100  # the prompt
    labels[1, 6:] = -100  # right padding
    labels[2, 3:] = -100  # nothing to score: sum 0, mean 0
    return logits, labels


@pytest.mark.parametrize("average", [False, True])
def test_get_batch_log_probs_equals_trl(average):
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    logits, labels = _logits_and_labels(torch.float64)
    ours = get_batch_log_probs(logits, labels, return_average_logprobs=average)
    expected = cpo.CPOTrainer.get_batch_logps(logits, labels.clone(), average_log_prob=average)
    keep = torch.tensor([True, True, not average, True])  # TRL divides 0 by 0 for a row with no scored token
    torch.testing.assert_close(ours[keep], expected[keep], atol=1e-12, rtol=0)
    assert ours[2] == 0


def test_get_batch_log_probs_is_float32_and_by_hand():
    logits, labels = _logits_and_labels(torch.bfloat16)
    ours = get_batch_log_probs(logits, labels)
    assert ours.dtype == torch.float32
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    row, expected = 1, 0.0
    for t in range(1, 9):
        if labels[row, t] != -100:
            expected += log_probs[row, t - 1, labels[row, t]].item()
    assert ours[row].item() == pytest.approx(expected, abs=1e-5)


def test_get_batch_log_probs_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"logits \[b, s, v\] and labels \[b, s\]"):
        get_batch_log_probs(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))


def test_logits_to_logprobs_and_truncation_for_logprobs():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=gen)
    tokens = torch.randint(0, 11, (2, 6), generator=gen)
    out = logits_to_logprobs(logits, tokens, temperature=0.7)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(out, expected)
    # [query of 2 | response of 4]: positions 1..4 predict the response
    assert torch.equal(truncate_sequence_for_logprobs(logits, 2), logits[:, 1:5])


def test_truncate_sequence_at_first_stop_token():
    sequences = torch.tensor([[869, 30, 869], [2, 30, 869], [50, 30, 869], [13, 30, 5], [13, 2, 2], [2, 2, 2]])
    mask, truncated = truncate_sequence_at_first_stop_token(sequences.clone(), torch.tensor([2, 869]), fill_value=0)
    assert truncated.tolist() == [[869, 0, 0], [2, 0, 0], [50, 30, 869], [13, 30, 5], [13, 2, 0], [2, 0, 0]]
    assert mask.tolist() == [
        [False, True, True],
        [False, True, True],
        [False, False, False],
        [False, False, False],
        [False, False, True],
        [False, True, True],
    ]


def test_get_reward_penalty_mask():
    padding = torch.tensor([[False, False, True], [False, False, False], [False, True, True]])
    lengths = torch.tensor([2, 3, 1])
    assert get_reward_penalty_mask(padding, lengths).tolist() == [False, True, False]
    assert get_reward_penalty_mask(padding, lengths, min_response_length=2).tolist() == [False, True, True]
    assert get_reward_penalty_mask(padding, lengths, penalise_no_eos=False).tolist() == [False, False, False]
