"""RewardModelLoss and RewardMetrics against the formula of TRL's RewardTrainer.compute_loss (TRL 1.16), run here on
the same rewards."""

import pytest
import torch
import torch.nn.functional as F

from tune.rlhf.loss import RewardMetrics, RewardModelLoss


def _trl_loss(chosen, rejected, margin=None, center=None):
    # RewardTrainer.compute_loss, written out on the rewards it splits from the model's logits
    if margin is not None:
        loss = -F.logsigmoid(chosen - rejected - margin).mean()
    else:
        loss = -F.logsigmoid(chosen - rejected).mean()
    if center is not None:
        loss += center * torch.mean((chosen + rejected) ** 2)
    return loss


@pytest.mark.parametrize("with_margin", [False, True])
@pytest.mark.parametrize("center", [None, 0.01])
def test_mean_of_per_pair_losses_is_trls_loss(with_margin, center):
    torch.manual_seed(0)
    chosen, rejected = torch.randn(8) * 3, torch.randn(8) * 3
    margin = torch.rand(8) if with_margin else None
    losses = RewardModelLoss(center_rewards_coefficient=center)(chosen, rejected, margin)
    assert losses.shape == (8,)
    torch.testing.assert_close(losses.mean(), _trl_loss(chosen, rejected, margin, center), atol=1e-6, rtol=0)


def test_loss_gradient_and_validation():
    chosen = torch.tensor([1.0, -2.0], requires_grad=True)
    RewardModelLoss()(chosen, torch.zeros(2)).sum().backward()
    torch.testing.assert_close(chosen.grad, -torch.sigmoid(-chosen.detach()))  # d/dx -log sigmoid(x)
    with pytest.raises(ValueError, match="center_rewards_coefficient"):
        RewardModelLoss(center_rewards_coefficient=-1.0)


def test_metrics_use_trls_names_and_reset():
    metrics = RewardMetrics(torch.device("cpu"))
    metrics.update(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    metrics.update(torch.tensor([3.0]), torch.tensor([-1.0]))
    values = metrics.compute()
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0, 3.0, -1.0])
    assert values == pytest.approx(
        {
            "accuracy": 2 / 3,
            "margin": (1 - 1 + 4) / 3,
            "min_reward": -1.0,
            "mean_reward": rewards.mean().item(),
            "max_reward": 3.0,
        }
    )
    assert metrics.compute() == {}
