"""GRPOLoss (tune/rlhf/loss/_grpo.py) and the GRPO advantages (tune/rlhf/_grpo.py) against TRL 1.16.

The reference is TRL's own code run on fixed tensors: ``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``
line 3020 in TRL 1.16; the loss types at lines 3153-3166) called on a stand-in trainer whose
``_get_per_token_logps_and_entropies`` returns the test's log-probabilities, and TRL's advantage formula
(``_generate_and_score_completions``, ``multi_objective_aggregation == "sum_then_normalize"`` with
``scale_rewards="group"``: lines 2762-2787) written out with TRL's own ``nanstd`` helper, since that method also
generates. Measured: the losses of every type are bit-identical to TRL's (fp32 and fp64); the advantages differ by
at most 6e-8 (TRL computes the Bessel factor count / (count - 1) in float32).
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tune.rlhf import completion_mask, grpo_advantages
from tune.rlhf.loss import GRPOLoss

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")

NUM_PROMPTS, GROUP, WIDTH, MAX_LEN = 3, 4, 7, 9


class _Accelerator:
    """The single-process accelerator calls TRL's loss makes."""

    num_processes = 1

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def _tensors(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = NUM_PROMPTS * GROUP
    mask = torch.zeros(n, WIDTH, dtype=torch.long)
    for row in range(n):
        mask[row, : int(torch.randint(1, WIDTH + 1, (1,), generator=gen))] = 1
    logps = -torch.rand(n, WIDTH, generator=gen, dtype=torch.float64) * 3
    old = logps + 0.4 * torch.randn(n, WIDTH, generator=gen, dtype=torch.float64)  # ratios inside and outside
    ref = logps + 0.3 * torch.randn(n, WIDTH, generator=gen, dtype=torch.float64)
    rewards = torch.randint(0, 3, (n,), generator=gen).double()
    return logps, old, ref, rewards, mask


def _trl_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    std = trl_utils.nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    return (rewards - mean) / (std + 1e-4)


def _trl_loss(loss_type, logps, old, ref, advantages, mask, beta, epsilon, epsilon_high) -> float:
    """TRL's ``GRPOTrainer._compute_loss`` on a stand-in trainer (token-level importance sampling, no vLLM)."""

    def fixed_logps(*args, **kwargs):
        return logps, torch.zeros_like(logps), None

    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=fixed_logps,
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LEN,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
        accelerator=_Accelerator(),
    )
    n = logps.shape[0]
    inputs = {
        "prompt_ids": torch.ones(n, 2, dtype=torch.long),
        "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.ones(n, WIDTH, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    loss = grpo_trainer.GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, trainer._metrics["train"]


def test_advantages_equal_trl():
    # TRL's nanstd computes its Bessel factor count / (count - 1) from integer counts, in float32: float32 rewards
    # (as the recipe's) agree to float32 rounding
    for seed in range(3):
        rewards = _tensors(seed)[3].float()
        expected = _trl_advantages(rewards, GROUP)
        ours = grpo_advantages(rewards, GROUP)
        torch.testing.assert_close(ours, expected, rtol=0, atol=5e-7)
        # shapes [num_prompts, group] give the same numbers
        torch.testing.assert_close(grpo_advantages(rewards.view(-1, GROUP), GROUP).flatten(), ours, rtol=0, atol=0)
    # a group of equal rewards has no signal
    assert grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4).abs().max() == 0


def test_advantages_bad_groups():
    with pytest.raises(ValueError, match="at least 2"):
        grpo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="groups of group_size=3"):
        grpo_advantages(torch.ones(4), 3)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta, epsilon, epsilon_high", [(0.0, 0.2, 0.2), (0.04, 0.2, 0.28), (0.1, 0.1, 0.3)])
def test_loss_types_equal_trl(loss_type, beta, epsilon, epsilon_high):
    logps, old, ref, rewards, mask = _tensors(1)
    advantages = grpo_advantages(rewards, GROUP)
    expected, metrics = _trl_loss(loss_type, logps, old, ref, advantages, mask, beta, epsilon, epsilon_high)
    loss_fn = GRPOLoss(
        epsilon=epsilon, epsilon_high=epsilon_high, beta=beta, loss_type=loss_type, max_completion_length=MAX_LEN
    )
    out = loss_fn(logps, old, advantages, mask.bool(), ref if beta > 0 else None)
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    # the clip fraction and the KL are TRL's logged metrics (TRL counts the tokens in float32)
    assert out.num_clipped.item() / mask.sum().item() == pytest.approx(metrics["clip_ratio/region_mean"][-1], abs=1e-7)
    if beta > 0:
        assert out.kl_sum.item() / mask.sum().item() == pytest.approx(metrics["kl"][-1], abs=1e-7)
        torch.testing.assert_close(out.loss, out.policy_loss + beta * out.kl_loss, rtol=0, atol=1e-12)
    else:
        torch.testing.assert_close(out.loss, out.policy_loss, rtol=0, atol=0)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_micro_batches_add_up_to_the_batch(loss_type):
    """With the step's totals, the losses (and gradients) of two halves add up to the loss of the whole batch."""
    logps, old, ref, rewards, mask = _tensors(2)
    advantages = grpo_advantages(rewards, GROUP)
    loss_fn = GRPOLoss(beta=0.1, loss_type=loss_type)
    whole = loss_fn(logps, old, advantages, mask.bool(), ref).loss
    half = logps.shape[0] // 2
    totals = dict(num_sequences=logps.shape[0], num_tokens=mask.sum())
    parts = [
        loss_fn(logps[s], old[s], advantages[s], mask[s].bool(), ref[s], **totals).loss
        for s in (slice(0, half), slice(half, None))
    ]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=0, atol=1e-12)


def test_on_policy_grpo_loss_is_zero():
    """beta = 0 and on-policy data (old log-probs == current): every ratio is exactly 1 and nothing is clipped, so
    the loss is exactly -mean(advantages) over the completions, whatever the log-probabilities; completions of
    one length (the per-completion token mean is then exactly the advantage) and advantages that cancel exactly
    (groups of 2: (r - m) / (s + eps) are exact negatives) make it exactly 0.0. Its gradient is not 0: it is
    -A_i / (|o_i| * n) on each token of completion i (the policy-gradient direction)."""
    gen = torch.Generator().manual_seed(5)
    rewards = torch.tensor([0.0, 1.0, 3.0, 0.5, 2.0, 2.0, 0.25, 1.75])  # 4 groups of 2
    advantages = grpo_advantages(rewards, 2)
    logps = (-torch.rand(8, WIDTH, generator=gen) * 4).requires_grad_()
    mask = torch.ones(8, WIDTH, dtype=torch.bool)
    out = GRPOLoss(loss_type="grpo")(logps, logps.detach(), advantages, mask)
    assert out.loss.item() == 0.0 and out.num_clipped.item() == 0 and out.kl_sum.item() == 0.0
    out.loss.backward()
    expected_grad = (-advantages / (WIDTH * 8))[:, None].expand(8, WIDTH)
    torch.testing.assert_close(logps.grad, expected_grad, rtol=1e-6, atol=0)
    assert logps.grad.abs().max() > 0.01

    # any lengths and rewards: grpo's loss is -mean(A), 0 up to rounding (a group's advantages sum to 0); bnpo
    # and dr_grpo weigh each completion by its length, so their on-policy loss is -sum(A_i |o_i|) / denominator,
    # 0 only when the completions of a group have one length
    logps, _, _, rewards, int_mask = _tensors(3)
    advantages = grpo_advantages(rewards, GROUP)
    lengths = int_mask.sum(1).double()
    expected = {
        "grpo": -advantages.mean(),
        "bnpo": -(advantages * lengths).sum() / lengths.sum(),
        "dr_grpo": -(advantages * lengths).sum() / (lengths.numel() * WIDTH),
    }
    assert abs(expected["grpo"].item()) < 1e-12  # float64 tensors
    for loss_type, value in expected.items():
        out = GRPOLoss(loss_type=loss_type)(logps, logps, advantages, int_mask.bool())
        assert out.num_clipped.item() == 0
        torch.testing.assert_close(out.loss, value, rtol=0, atol=1e-12)
    assert bool((torch.exp(logps - logps) == 1).all())


def test_loss_argument_errors():
    with pytest.raises(ValueError, match="loss_type must be one of"):
        GRPOLoss(loss_type="ppo")
    with pytest.raises(ValueError, match="beta must be >= 0"):
        GRPOLoss(beta=-1.0)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        GRPOLoss(beta=0.1)(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool))
    assert not GRPOLoss().needs_reference and GRPOLoss(beta=0.04).needs_reference


def test_completion_mask_keeps_the_first_stop_token():
    completions = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 7, 2, 9], [4, 4, 4, 4, 4], [9, 9, 9, 9, 3]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(completion_mask(completions, [2, 3]), expected)
