"""Sampling: greedy, temperature, top-k and top-p against hand-derived distributions and transformers' warpers;
torchtune's return meaning ([..., 1] int32) and its seeded draws."""

import math

import pytest
import torch

from tune.generation import apply_top_k, apply_top_p, sample


def _log(probs: list[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def _frequencies(logits: torch.Tensor, num_draws: int, **kwargs) -> torch.Tensor:
    rng = torch.Generator().manual_seed(1234)
    tokens = sample(logits.expand(num_draws, -1), rng=rng, **kwargs)[:, 0]
    return torch.bincount(tokens.long(), minlength=logits.shape[-1]).float() / num_draws


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    argmax = logits.argmax(dim=-1, keepdim=True).int()
    assert torch.equal(sample(logits, temperature=0.0), argmax)
    # top-k / top-p do not change the argmax, which both always keep
    assert torch.equal(sample(logits, temperature=0.0, top_k=3, top_p=0.5), argmax)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_returns_torchtune_shape_and_dtype(temperature):
    # torchtune's sample: argmax(..., keepdim=True) as int32, so [..., vocab] -> [..., 1]
    for shape in [(10,), (3, 10), (2, 3, 10)]:
        tokens = sample(torch.randn(shape), temperature=temperature)
        assert tokens.shape == (*shape[:-1], 1) and tokens.dtype == torch.int32, shape


def test_seeded_draws_equal_torchtune():
    torch.manual_seed(0)
    logits = torch.randn(4, 10)
    torch.manual_seed(1)
    tokens = sample(logits, temperature=0.8, top_k=5)
    # torchtune 0.6.1's sample(logits, temperature=0.8, top_k=5) after the same seeds, computed with its own
    # environment by `python -m tests.tune.generation._torchtune_reference` (torch 2.13 in both)
    assert tokens.tolist() == [[5], [4], [6], [9]] and tokens.dtype == torch.int32
    # the same draw written out: the exponential race over the top-5 softmax, noise from the global generator
    torch.manual_seed(1)
    q = torch.empty(4, 10).exponential_(1)
    probs = torch.softmax(apply_top_k(logits / 0.8, 5), dim=-1)
    assert torch.equal(tokens, (probs / q).argmax(dim=-1, keepdim=True).int())


def test_top_k_hand_derived():
    # p = [0.1, 0.2, 0.3, 0.4]; top-2 keeps tokens 3 and 2, renormalised: [0, 0, 0.3/0.7, 0.4/0.7].
    filtered = apply_top_k(_log([0.1, 0.2, 0.3, 0.4]), 2)
    expected = torch.tensor([[0.0, 0.0, 3 / 7, 4 / 7]])
    torch.testing.assert_close(torch.softmax(filtered, dim=-1), expected, rtol=0, atol=1e-6)
    assert torch.equal(apply_top_k(_log([0.1, 0.9]), 5), _log([0.1, 0.9]))  # k >= vocab keeps all


def test_top_k_keeps_ties_with_the_kth():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    kept = torch.isfinite(apply_top_k(logits, 2))
    assert kept.tolist() == [[False, True, True, True, False]]


def test_top_p_hand_derived():
    # p = [0.5, 0.25, 0.15, 0.1] (already sorted). Mass before each token: 0, 0.5, 0.75, 0.9.
    # top_p = 0.7 keeps tokens whose preceding mass < 0.7: {0, 1}, renormalised [2/3, 1/3, 0, 0].
    filtered = apply_top_p(_log([0.5, 0.25, 0.15, 0.1]), 0.7)
    expected = torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]])
    torch.testing.assert_close(torch.softmax(filtered, dim=-1), expected, rtol=0, atol=1e-6)
    # Unsorted input: the same distribution permuted gives the same set; a tiny top_p keeps the argmax only.
    permuted = apply_top_p(_log([0.15, 0.5, 0.1, 0.25]), 0.7)
    assert torch.isfinite(permuted).tolist() == [[False, True, False, True]]
    assert torch.isfinite(apply_top_p(_log([0.15, 0.5, 0.1, 0.25]), 1e-3)).tolist() == [[False, True, False, False]]


@pytest.mark.parametrize("top_k, top_p", [(5, None), (None, 0.8), (7, 0.6), (3, 0.95)])
def test_filters_match_transformers_warpers(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    scores = torch.randn(4, 40) * 2
    ours, theirs = scores, scores
    if top_k is not None:
        ours, theirs = apply_top_k(ours, top_k), TopKLogitsWarper(top_k)(None, theirs)
    if top_p is not None:
        ours, theirs = apply_top_p(ours, top_p), TopPLogitsWarper(top_p)(None, theirs)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)], rtol=0, atol=0)


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = _log([0.1, 0.2, 0.3, 0.4])
    num_draws = 40_000  # standard error of a frequency <= sqrt(0.25 / 40000) = 0.0025; tolerance 0.015 = 6 sigma
    freq = _frequencies(logits, num_draws, temperature=1.0)
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), rtol=0, atol=0.015)
    freq = _frequencies(logits, num_draws, temperature=1.0, top_k=2)
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]), rtol=0, atol=0.015)
    # temperature 0.5 squares the probabilities before renormalising: p^2 / sum(p^2), sum = 0.30
    freq = _frequencies(logits, num_draws, temperature=0.5)
    torch.testing.assert_close(freq, torch.tensor([0.01, 0.04, 0.09, 0.16]) / 0.30, rtol=0, atol=0.015)
    # top_p = 0.5 over p = [0.1, 0.2, 0.3, 0.4]: mass before (sorted 0.4, 0.3, ...) is 0, 0.4, 0.7 -> keep {3, 2}
    freq = _frequencies(logits, num_draws, temperature=1.0, top_p=0.5)
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]), rtol=0, atol=0.015)


def test_rng_makes_draws_reproducible():
    logits = torch.randn(8, 100)
    first = sample(logits, temperature=1.0, rng=torch.Generator().manual_seed(7))
    second = sample(logits, temperature=1.0, rng=torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample(torch.randn(1, 4), **kwargs)


def test_q_noise_picks_argmax_of_probs_over_q():
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[0.1, 5.0, 0.2, 4.0], [3.0, 0.5, 1.0, 2.0]])
    probs = torch.softmax(logits / 0.7, dim=-1)
    assert torch.equal(sample(logits, temperature=0.7, q=q), (probs / q).argmax(dim=-1, keepdim=True).int())
    assert sample(logits, temperature=0.0, q=q).tolist() == [[3], [0]]  # greedy ignores the noise
    # with exponential noise the draws follow the distribution (the exponential race)
    gen = torch.Generator().manual_seed(0)
    row = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    draws = [sample(row, q=torch.empty(1, 2).exponential_(1, generator=gen)).item() for _ in range(2000)]
    assert abs(sum(draws) / 2000 - 0.75) < 0.04
