"""tune/rlhf/_ppo.py: per-token rewards and generalised advantage estimation against the equations, evaluated
term by term in plain Python (Schulman et al. 2015, arXiv:1506.02438, eq. 16: A_t = sum_l (gamma lambda)^l
delta_{t+l}; Ziegler et al. 2019, arXiv:1909.08593, eq. 2: r = score - beta * log(pi / pi_ref))."""

import pytest
import torch

from tune.rlhf import PPOStats, Trajectory, estimate_advantages, get_rewards_ppo, whiten


def _gae_by_sums(values: list[float], rewards: list[float], gamma: float, lmbda: float) -> list[float]:
    n = len(values)
    value = [*values, 0.0]  # the state after the last response token is terminal
    deltas = [rewards[t] + gamma * value[t + 1] - value[t] for t in range(n)]
    return [sum((gamma * lmbda) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]


def _batch():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    rewards = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    return values, rewards


@pytest.mark.parametrize("gamma, lmbda", [(1.0, 0.95), (0.9, 0.7), (1.0, 1.0)])
def test_estimate_advantages_equals_the_discounted_sum_of_td_errors(gamma, lmbda):
    values, rewards = _batch()
    advantages, returns = estimate_advantages(values, rewards, gamma, lmbda)
    raw = torch.tensor(
        [_gae_by_sums(v, r, gamma, lmbda) for v, r in zip(values.tolist(), rewards.tolist())], dtype=torch.float64
    )
    torch.testing.assert_close(returns, raw.double() + values, atol=1e-12, rtol=0)
    # the advantages are whitened over the batch, keeping their mean
    expected = (raw - raw.mean()) / (raw.var() + 1e-8).sqrt() + raw.mean()
    torch.testing.assert_close(advantages, expected.double(), atol=1e-10, rtol=0)


def test_estimate_advantages_with_masks_whitens_over_the_response_and_zeroes_padding():
    values, rewards = _batch()
    masks = torch.ones(3, 6, dtype=torch.bool)
    masks[0, 4:] = False
    masks[2, 2:] = False
    values, rewards = values.masked_fill(~masks, 0.0), rewards.masked_fill(~masks, 0.0)
    advantages, returns = estimate_advantages(values, rewards, 1.0, 0.95, masks=masks)
    raw = torch.tensor(
        [_gae_by_sums(v, r, 1.0, 0.95) for v, r in zip(values.tolist(), rewards.tolist())], dtype=torch.float64
    )
    torch.testing.assert_close(returns, raw + values, atol=1e-12, rtol=0)
    kept = raw[masks]
    expected = (raw - kept.mean()) / (kept.var() + 1e-8).sqrt() + kept.mean()
    torch.testing.assert_close(advantages[masks], expected[masks], atol=1e-10, rtol=0)
    assert (advantages[~masks] == 0).all()
    torch.testing.assert_close(advantages, whiten(raw, masks).masked_fill(~masks, 0.0), atol=1e-10, rtol=0)


def test_get_rewards_ppo_puts_the_score_at_the_given_position():
    gen = torch.Generator().manual_seed(1)
    logprobs, ref_logprobs = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)
    scores = torch.tensor([2.0, -1.0])
    total, kl, kl_reward = get_rewards_ppo(scores, logprobs, ref_logprobs, 0.1, torch.tensor([1, 4]))
    for row in range(2):
        for t in range(5):
            expected_kl = logprobs[row, t].item() - ref_logprobs[row, t].item()
            expected = -0.1 * expected_kl + (scores[row].item() if t == [1, 4][row] else 0.0)
            assert kl[row, t].item() == pytest.approx(expected_kl, abs=1e-6)
            assert kl_reward[row, t].item() == pytest.approx(-0.1 * expected_kl, abs=1e-6)
            assert total[row, t].item() == pytest.approx(expected, abs=1e-6)
    last, _, _ = get_rewards_ppo(scores, logprobs, ref_logprobs, 0.1)  # no index: the last position
    torch.testing.assert_close(last[:, :-1], kl_reward[:, :-1])
    torch.testing.assert_close(last[:, -1], kl_reward[:, -1] + scores)


def test_named_tuples_have_torchtunes_fields():
    assert PPOStats._fields == ("loss", "policy_loss", "value_loss", "ratios", "clipfrac", "approx_policy_kls")
    assert Trajectory._fields == (
        "query_responses",
        "logprobs",
        "ref_logprobs",
        "values",
        "masks",
        "position_ids",
        "response_padding_masks",
        "value_padding_masks",
        "value_seq_idxs",
        "scores",
        "seq_lens",
    )
