"""tune/rlhf/_metrics.py: the step-averaged preference metrics equal the same averages computed over all pairs."""

import pytest
import torch

from tune.rlhf import PreferenceMetrics


def test_metrics_average_over_every_micro_batch():
    gen = torch.Generator().manual_seed(0)
    metrics = PreferenceMetrics(torch.device("cpu"))
    everything = {k: [] for k in ("cr", "rr", "cl", "rl")}
    logit_sums, token_counts = [0.0, 0.0], [0, 0]
    for num_pairs in (2, 3):  # two micro-batches of different sizes
        cr, rr, cl, rl = torch.randn(4, num_pairs, generator=gen)
        logits = torch.randn(2 * num_pairs, 5, 7, generator=gen)
        labels = torch.randint(0, 7, (2 * num_pairs, 5), generator=gen)
        labels[:, :2] = -100
        labels[0, 4] = -100
        metrics.update(cr, rr, cl, rl, logits, labels)
        for key, value in zip(everything, (cr, rr, cl, rl)):
            everything[key].append(value)
        for row in range(2 * num_pairs):
            half = 0 if row < num_pairs else 1
            for t in range(1, 5):
                if labels[row, t] != -100:
                    logit_sums[half] += logits[row, t - 1].mean().item()
                    token_counts[half] += 1
    cr, rr, cl, rl = (torch.cat(v) for v in everything.values())
    out = metrics.compute()
    assert out["rewards/chosen"] == pytest.approx(cr.mean().item(), abs=1e-6)
    assert out["rewards/rejected"] == pytest.approx(rr.mean().item(), abs=1e-6)
    assert out["rewards/margins"] == pytest.approx((cr - rr).mean().item(), abs=1e-6)
    assert out["rewards/accuracies"] == pytest.approx((cr > rr).double().mean().item(), abs=1e-12)
    assert out["logps/chosen"] == pytest.approx(cl.mean().item(), abs=1e-6)
    assert out["logps/rejected"] == pytest.approx(rl.mean().item(), abs=1e-6)
    assert out["logits/chosen"] == pytest.approx(logit_sums[0] / token_counts[0], abs=1e-6)
    assert out["logits/rejected"] == pytest.approx(logit_sums[1] / token_counts[1], abs=1e-6)
    assert metrics.compute() == {}  # a new window


def test_equal_rewards_are_not_accurate():
    metrics = PreferenceMetrics(torch.device("cpu"))
    zeros = torch.zeros(4)
    metrics.update(zeros, zeros, zeros - 1, zeros - 2)
    out = metrics.compute()
    assert out["rewards/accuracies"] == 0 and out["rewards/margins"] == 0 and "logits/chosen" not in out
