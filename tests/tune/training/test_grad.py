"""Gradient clipping against torch.nn.utils.clip_grad_norm_, and the non-finite loss check."""

import math

import pytest
import torch
from torch import nn

from tune.training import FiniteLossCheck, NonFiniteLossError, check_loss_is_finite, clip_grad_norm


def _model_with_grads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 1))
    model(torch.randn(4, 5)).sum().mul(10).backward()
    return model


@pytest.mark.parametrize("max_norm", [0.1, 1e6])
def test_clip_grad_norm_matches_torch(max_norm):
    ours, reference = _model_with_grads(), _model_with_grads()
    got = clip_grad_norm(ours, max_norm)
    want = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    torch.testing.assert_close(got, want)
    for p, q in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_clip_grad_norm_none_only_measures():
    model = _model_with_grads()
    before = [p.grad.clone() for p in model.parameters()]
    norm = clip_grad_norm(model.parameters(), None)
    want = torch.sqrt(sum((g**2).sum() for g in before))
    torch.testing.assert_close(norm, want)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before))
    with pytest.raises(ValueError, match="positive or null"):
        clip_grad_norm(model, 0.0)


def test_check_loss_is_finite_names_the_step():
    assert check_loss_is_finite(torch.tensor(1.5), step=3) == 1.5
    for bad in (float("nan"), math.inf, torch.tensor(-math.inf)):
        with pytest.raises(NonFiniteLossError, match="at step 7.*learning rate") as info:
            check_loss_is_finite(bad, step=7)
        assert info.value.step == 7


def test_finite_loss_check_stops_before_the_optimizer_applies_a_nan_step():
    # the loop of every recipe: record after each forward, check once backward is queued, then step
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    check = FiniteLossCheck(torch.device("cpu"))
    inputs = [torch.randn(3, 4), torch.randn(3, 4), torch.full((3, 4), float("nan"))]
    for step, x in enumerate(inputs, start=1):
        step_loss = torch.zeros(())
        loss = model(x).pow(2).mean()
        step_loss += loss.detach()
        check.record(step_loss)
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        if step < 3:
            check.check(step)
            optimizer.step()
            optimizer.zero_grad()
            continue
        with pytest.raises(NonFiniteLossError, match="nan at step 3"):
            check.check(step)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # step 3 was never applied
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_finite_loss_check_sums_over_ranks_when_given_a_reduction():
    seen = []

    def all_reduce(t: torch.Tensor) -> torch.Tensor:  # another rank contributes a NaN
        seen.append(t.item())
        return t + float("nan")

    check = FiniteLossCheck(torch.device("cpu"), all_reduce=all_reduce)
    check.record(torch.tensor(0.5))
    with pytest.raises(NonFiniteLossError, match="at step 1"):
        check.check(1)
    assert seen == [0.5]
