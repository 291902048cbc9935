"""tune/rlhf/loss/_ppo.py: PPOLoss against the clipped objective evaluated element by element in plain Python
(Schulman et al. 2017, arXiv:1707.06347, eq. 7; the clipped value loss of OpenAI baselines' ppo2)."""

import math

import pytest
import torch

from tune.rlhf.loss import PPOLoss


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 7, generator=gen, dtype=torch.float64) * 3
    new = old + 0.4 * torch.randn(3, 7, generator=gen, dtype=torch.float64)  # ratios both sides of the clip
    advantages = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    old_values = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    values = old_values + 0.5 * torch.randn(3, 7, generator=gen, dtype=torch.float64)
    returns = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    masks = torch.rand(3, 7, generator=gen) > 0.3
    value_masks = torch.rand(3, 7, generator=gen) > 0.2
    return old, new, advantages, old_values, values, returns, masks, value_masks


def _reference(old, new, adv, old_v, v, ret, masks, value_masks, eps, clip_v, coeff):
    policy_terms, clipped_flags, value_terms = [], [], []
    for i in range(len(old)):
        for t in range(len(old[0])):
            ratio = math.exp(new[i][t] - old[i][t])
            clipped_ratio = min(max(ratio, 1 - eps), 1 + eps)
            if masks[i][t]:
                # min of the surrogates, negated to a loss
                policy_terms.append(-min(ratio * adv[i][t], clipped_ratio * adv[i][t]))
                clipped_flags.append(float(-clipped_ratio * adv[i][t] > -ratio * adv[i][t]))
            if value_masks[i][t]:
                v_clipped = min(max(v[i][t], old_v[i][t] - clip_v), old_v[i][t] + clip_v)
                value_terms.append(max((v[i][t] - ret[i][t]) ** 2, (v_clipped - ret[i][t]) ** 2))
    policy = sum(policy_terms) / len(policy_terms)
    value = 0.5 * sum(value_terms) / len(value_terms)
    return policy + coeff * value, policy, value, sum(clipped_flags) / len(clipped_flags)


@pytest.mark.parametrize("eps, clip_v, coeff", [(0.1, 0.2, 0.1), (0.2, 0.05, 0.5)])
def test_ppo_loss_equals_the_clipped_objective(eps, clip_v, coeff):
    old, new, adv, old_v, v, ret, masks, value_masks = _inputs()
    loss_fn = PPOLoss(epsilon=eps, value_clip_range=clip_v, value_coeff=coeff)
    loss, policy, value, ratios, clipfrac = loss_fn(old, new, adv, old_v, v, ret, masks, value_masks)
    expected = _reference(*(x.tolist() for x in (old, new, adv, old_v, v, ret, masks, value_masks)), eps, clip_v, coeff)
    assert 0 < expected[3] < 1  # some ratios were clipped, some not
    for got, want in zip((loss, policy, value, clipfrac), expected):
        assert got.item() == pytest.approx(want, rel=1e-8)  # masked means add 1e-8 to the count
    assert ratios.item() == pytest.approx(torch.exp(new - old).mean().item(), abs=1e-12)


def test_ppo_loss_without_masks_averages_everything_and_has_gradients():
    old, new, adv, old_v, v, ret, _, _ = _inputs(1)
    new, v = new.clone().requires_grad_(), v.clone().requires_grad_()
    ones = torch.ones_like(old, dtype=torch.bool)
    loss, policy, value, _, _ = PPOLoss()(old, new, adv, old_v, v, ret)
    expected = _reference(
        *(x.tolist() for x in (old, new.detach(), adv, old_v, v.detach(), ret, ones, ones)), 0.1, 0.2, 0.1
    )
    assert loss.item() == pytest.approx(expected[0], abs=1e-12)
    loss.backward()
    assert new.grad.abs().sum() > 0 and v.grad.abs().sum() > 0
    assert not policy.requires_grad and not value.requires_grad


def test_ppo_loss_is_the_negated_mean_advantage_on_policy():
    # at ratio 1 nothing is clipped and the policy loss is -mean(A); its gradient is -A / n per log-prob
    old, _, adv, old_v, _, ret, _, _ = _inputs(2)
    new = old.clone().requires_grad_()
    loss, policy, _, ratios, clipfrac = PPOLoss(value_coeff=0.0)(old, new, adv, old_v, old_v, ret)
    assert policy.item() == pytest.approx(-adv.mean().item(), abs=1e-12)
    assert ratios.item() == 1.0 and clipfrac.item() == 0.0
    loss.backward()
    torch.testing.assert_close(new.grad, -adv / adv.numel())
