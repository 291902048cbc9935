"""tune.rlhf.loss.ORPOLoss and ORPO's NLL term against TRL 1.16's own ORPO code.

The reference values come from TRL's ``ORPOTrainer`` (trl.experimental.orpo), not from formulas written here:
``odds_ratio_loss`` runs on a stand-in trainer object (its ``beta`` and ``accelerator.device``), and
``concatenated_forward`` (TRL's log-probabilities and its NLL over the whole chosen sequence) on a stand-in whose
model returns fixed logits. TRL's ``losses`` are ``beta * log sigmoid(z)`` (its loss is ``nll - losses.mean()``);
tune's per-pair losses are their negation.
"""

from types import SimpleNamespace

import pytest
import torch

from tune.rlhf import PreferenceMetrics, chosen_nll_labels, model_sequence_log_probs, sequence_log_probs
from tune.rlhf.loss import ORPOLoss, log1mexp

orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")

CPU = torch.device("cpu")


def _trl_odds_ratio(beta: float, chosen: torch.Tensor, rejected: torch.Tensor):
    stand_in = SimpleNamespace(beta=beta, accelerator=SimpleNamespace(device=CPU))
    return orpo.ORPOTrainer.odds_ratio_loss(stand_in, chosen, rejected)


# mean log-probabilities per token: far from 0, around log(1/2) (where log1mexp switches form), and near 0
CHOSEN = [-3.0, -0.7, -0.69, -1e-3, -1e-6, -2e-7, -30.0, -0.05]
REJECTED = [-2.5, -0.6, -0.7, -2.0, -1e-5, -4.0, -0.01, -1e-7]


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_loss_rewards_and_metrics_equal_trl_odds_ratio_loss(beta):
    chosen, rejected = torch.tensor(CHOSEN), torch.tensor(REJECTED)
    trl_losses, trl_chosen, trl_rejected, trl_ratio, trl_log_odds = _trl_odds_ratio(beta, chosen, rejected)
    loss = ORPOLoss(beta=beta)
    losses, chosen_rewards, rejected_rewards = loss(chosen, rejected)
    worst = (losses + trl_losses).abs().max().item()
    print(f"beta {beta}: max |tune - TRL| per-pair loss {worst:.1e}")
    torch.testing.assert_close(losses, -trl_losses, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(chosen_rewards, trl_chosen, atol=0, rtol=0)
    torch.testing.assert_close(rejected_rewards, trl_rejected, atol=0, rtol=0)
    metrics = PreferenceMetrics(CPU)
    metrics.update(chosen_rewards, rejected_rewards, chosen, rejected, log_odds=loss.log_odds(chosen, rejected))
    out = metrics.compute()
    assert out["log_odds_ratio"] == pytest.approx(trl_ratio.item(), abs=1e-6, rel=1e-6)
    assert out["log_odds_chosen"] == pytest.approx(trl_log_odds.item(), abs=1e-5, rel=1e-6)
    assert out["rewards/accuracies"] == pytest.approx((trl_chosen > trl_rejected).float().mean().item())
    assert out["rewards/margins"] == pytest.approx((trl_chosen - trl_rejected).mean().item(), abs=1e-6)


def test_log1mexp_is_accurate_and_its_gradient_finite_up_to_zero():
    x = torch.tensor([-50.0, -5.0, -0.7, -0.6931, -0.69, -1e-3, -1e-8, -1e-30, 0.0], dtype=torch.float64)
    exact = torch.log(-torch.expm1(x.clamp(max=-torch.finfo(torch.float32).tiny)))  # in float64
    torch.testing.assert_close(log1mexp(x.float()).double(), exact, rtol=1e-6, atol=1e-6)
    # a log-probability that rounded to 0 (probability 1): finite values and gradients, no 0 * inf in a branch
    chosen = torch.tensor([0.0, -1e-7, -2.0], requires_grad=True)
    rejected = torch.tensor([-1.0, 0.0, -1e-7], requires_grad=True)
    losses, *_ = ORPOLoss()(chosen, rejected)
    losses.sum().backward()
    assert torch.isfinite(losses).all() and torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()
    assert losses[0] < losses[2]  # the certain chosen answer has the small loss


def test_beta_must_be_positive():
    with pytest.raises(ValueError, match="beta"):
        ORPOLoss(beta=0.0)
    loss = ORPOLoss()
    assert loss.reference_free and loss.average_log_probs and loss.chosen_nll


def _ragged_batch(num_pairs: int = 3, length: int = 11, vocab: int = 17, seed: int = 0):
    """TRL's per-side batch (right-padded ids, attention masks, labels -100 on the prompt and padding) and the
    same pairs as tune's collate lays them out: [2b, s], chosen rows first, padded to one length."""
    gen = torch.Generator().manual_seed(seed)
    sides = {}
    for side in ("chosen", "rejected"):
        ids = torch.zeros(num_pairs, length, dtype=torch.long)
        mask = torch.zeros(num_pairs, length, dtype=torch.long)
        labels = torch.full((num_pairs, length), -100)
        for row in range(num_pairs):
            prompt = int(torch.randint(2, 5, (1,), generator=gen))
            total = prompt + int(torch.randint(1, length - prompt + 1, (1,), generator=gen))
            ids[row, :total] = torch.randint(1, vocab, (total,), generator=gen)
            mask[row, :total] = 1
            labels[row, prompt:total] = ids[row, prompt:total]
        sides[side] = (ids, mask, labels)
    keys = ("input_ids", "attention_mask", "labels")
    trl_batch = {f"{side}_{key}": value for side, v in sides.items() for key, value in zip(keys, v)}
    tokens = torch.cat([sides["chosen"][0], sides["rejected"][0]])
    labels = torch.cat([sides["chosen"][2], sides["rejected"][2]])
    return trl_batch, tokens, labels


def test_nll_and_mean_log_probs_equal_trl_concatenated_forward():
    vocab = 17
    trl_batch, tokens, labels = _ragged_batch(vocab=vocab)
    logits = torch.randn(*tokens.shape, vocab, generator=torch.Generator().manual_seed(1)) * 3

    def fixed_model(input_ids, attention_mask=None, use_cache=False):
        assert torch.equal(input_ids, tokens)
        return SimpleNamespace(logits=logits)

    stand_in = SimpleNamespace(
        concatenated_inputs=orpo.ORPOTrainer.concatenated_inputs,
        get_batch_logps=orpo.ORPOTrainer.get_batch_logps,
        is_encoder_decoder=False,
        padding_value=0,
        aux_loss_enabled=False,
        accelerator=SimpleNamespace(device=CPU),
    )
    trl_chosen, trl_rejected, _, _, trl_nll = orpo.ORPOTrainer.concatenated_forward(stand_in, fixed_model, trl_batch)

    nll_labels = chosen_nll_labels(tokens, labels)
    # a user's model (logits out) and a tune decoder's path (hidden states, only the scored positions projected)
    from_logits = model_sequence_log_probs(
        lambda t: logits, tokens, labels, average_log_probs=True, nll_labels=nll_labels
    )
    hidden = torch.randn(*tokens.shape, 8, generator=torch.Generator().manual_seed(2))
    projection = torch.nn.Linear(8, vocab, bias=False)
    with torch.no_grad():
        projected_logits = projection(hidden)
    trl_projected = orpo.ORPOTrainer.concatenated_forward(
        stand_in, lambda input_ids, **_: SimpleNamespace(logits=projected_logits), trl_batch
    )
    for select in (True, False):  # CPU's gathered positions and the accelerator's every-position form
        from_hidden = sequence_log_probs(
            hidden, labels, projection, average_log_probs=True, nll_labels=nll_labels, select_labelled=select
        )
        nll = from_hidden.nll_sums.sum() / from_hidden.nll_tokens.sum()
        torch.testing.assert_close(nll, trl_projected[4], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(from_hidden.log_probs, torch.cat(trl_projected[:2]), atol=1e-6, rtol=1e-6)

    nll = from_logits.nll_sums.sum() / from_logits.nll_tokens.sum()
    print(f"NLL: tune {nll.item():.7f}, TRL {trl_nll.item():.7f}")
    torch.testing.assert_close(nll, trl_nll, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(from_logits.log_probs, torch.cat([trl_chosen, trl_rejected]), atol=1e-6, rtol=1e-6)
    # the NLL covers every non-padding chosen token after the first, and nothing of the rejected rows
    num_pairs = tokens.shape[0] // 2
    expected = trl_batch["chosen_attention_mask"][:, 1:].sum(dim=-1)
    assert torch.equal(from_logits.nll_tokens[:num_pairs], expected)
    assert from_logits.nll_tokens[num_pairs:].sum() == 0 and from_logits.nll_sums[num_pairs:].abs().sum() == 0
    # the completion log-probs are unchanged by asking for the NLL too
    plain = model_sequence_log_probs(lambda t: logits, tokens, labels, average_log_probs=True)
    torch.testing.assert_close(plain.log_probs, from_logits.log_probs, atol=0, rtol=0)


def test_nll_gradient_equals_the_cross_entropy_gradient():
    # the projected-positions path backpropagates the NLL as a plain cross-entropy over the chosen tokens does
    _, tokens, labels = _ragged_batch(num_pairs=2, seed=3)
    hidden = torch.randn(*tokens.shape, 8, generator=torch.Generator().manual_seed(4), requires_grad=True)
    projection = torch.nn.Linear(8, 17, bias=False)
    nll_labels = chosen_nll_labels(tokens, labels)
    scores = sequence_log_probs(hidden, labels, projection, average_log_probs=True, nll_labels=nll_labels)
    (scores.nll_sums.sum() / scores.nll_tokens.sum()).backward()
    ours = hidden.grad.clone()
    hidden.grad = None
    logits = projection(hidden)
    reference = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 17), nll_labels[:, 1:].reshape(-1), ignore_index=-100
    )
    reference.backward()
    torch.testing.assert_close(ours, hidden.grad, atol=1e-6, rtol=1e-5)
