"""GRPOLoss against TRL's ``GRPOTrainer._compute_loss`` in float32, the dtype the recipes compute the loss in
(tests/tune/rlhf/loss/test_grpo.py compares float64 tensors). The stand-in trainer that runs TRL's own code on
fixed tensors is that file's; TRL is imported here directly, so a moved import path fails instead of skipping.

Measured (TRL 1.16, 12 completions of up to 7 tokens, ratios inside and outside the trust region): the losses of
every type, with and without the KL term, and their gradients with respect to the log-probabilities are
bit-identical to TRL's; the tolerances leave room for a different summation order on another CPU.
"""

import pytest
import torch
import trl.trainer.grpo_trainer  # noqa: F401  (the reference: an ImportError fails the test, it does not skip)

from tests.tune.rlhf.loss.test_grpo import GROUP, MAX_LEN, _tensors, _trl_loss
from tune.rlhf import grpo_advantages
from tune.rlhf.loss import GRPOLoss

LOSS_ATOL, GRAD_ATOL = 1e-6, 1e-7  # float32 rounding of sums over ~50 tokens


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta, epsilon, epsilon_high", [(0.0, 0.2, 0.2), (0.04, 0.2, 0.28)])
def test_fp32_loss_and_gradient_equal_trl(loss_type, beta, epsilon, epsilon_high):
    logps, old, ref, rewards, mask = (t.float() if t.is_floating_point() else t for t in _tensors(3))
    advantages = grpo_advantages(rewards, GROUP)
    assert logps.dtype == old.dtype == ref.dtype == advantages.dtype == torch.float32

    theirs_logps = logps.clone().requires_grad_(True)
    expected, _ = _trl_loss(loss_type, theirs_logps, old, ref, advantages, mask, beta, epsilon, epsilon_high)
    expected.backward()

    ours_logps = logps.clone().requires_grad_(True)
    loss_fn = GRPOLoss(
        epsilon=epsilon, epsilon_high=epsilon_high, beta=beta, loss_type=loss_type, max_completion_length=MAX_LEN
    )
    out = loss_fn(ours_logps, old, advantages, mask.bool(), ref if beta > 0 else None)
    out.loss.backward()

    assert out.loss.dtype == expected.dtype == torch.float32
    loss_diff = (out.loss - expected).abs().item()
    grad_diff = (ours_logps.grad - theirs_logps.grad).abs().max().item()
    print(f"{loss_type} beta={beta}: loss {out.loss.item():.6f}, |ours - TRL| {loss_diff:.3g}, grad {grad_diff:.3g}")
    assert loss_diff <= LOSS_ATOL
    assert grad_diff <= GRAD_ATOL
    assert theirs_logps.grad.abs().max() > 1e-3  # the gradient is not trivially 0
