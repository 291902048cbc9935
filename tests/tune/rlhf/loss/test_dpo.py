"""tune.rlhf.loss against TRL 1.16's own loss code on the same log-probabilities.

The reference values come from TRL itself, not from formulas written here: ``DPOTrainer._compute_loss`` (the
code of every DPO ``loss_type``) runs on a stand-in trainer object whose model returns fixed per-token
log-probabilities, with the reference log-probabilities precomputed; SimPO runs through TRL's
``CPOTrainer.cpo_loss`` (``loss_type="simpo"``). Per-pair losses are compared through their mean (TRL returns
the mean) and the rewards through TRL's logged metrics.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tune.rlhf.loss import DPOLoss, RSOLoss, SimPOLoss

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")

NUM_PAIRS, LENGTH = 6, 12


class _Identity:
    """The parts of ``accelerate.Accelerator`` the loss code calls, on one process."""

    device = torch.device("cpu")

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def unwrap_model(model):
        return model


class _FixedModel(torch.nn.Module):
    """Returns given per-token log-probabilities as TRL's fused LM head would (0 outside the completions)."""

    def __init__(self, per_token_logps: torch.Tensor):
        super().__init__()
        self.per_token_logps = per_token_logps

    def forward(self, **kwargs):
        shape = self.per_token_logps.shape
        return SimpleNamespace(
            log_probs=self.per_token_logps,
            entropy=torch.zeros(shape),
            mean_logits=torch.zeros(shape),
            is_top1=torch.zeros(shape, dtype=torch.bool),
        )


def _pairs(seed: int = 0):
    """Per-token policy log-probabilities of chosen then rejected rows [2n, L-1] with ragged completions, and
    precomputed reference sequence log-probabilities."""
    gen = torch.Generator().manual_seed(seed)
    completion_mask = torch.zeros(2 * NUM_PAIRS, LENGTH, dtype=torch.long)
    for row in range(2 * NUM_PAIRS):  # prompt of 2-4 tokens, completion of 2-7
        start = int(torch.randint(2, 5, (1,), generator=gen))
        length = int(torch.randint(2, 8, (1,), generator=gen))
        completion_mask[row, start : start + length] = 1
    shift_mask = completion_mask[:, 1:]
    per_token = -torch.rand(2 * NUM_PAIRS, LENGTH - 1, generator=gen, dtype=torch.float64) * 3 * shift_mask
    ref = -torch.rand(2 * NUM_PAIRS, generator=gen, dtype=torch.float64) * 3 * shift_mask.sum(dim=1)
    return per_token, completion_mask, ref


def _trl_dpo(loss_type: str, beta: float, label_smoothing: float, per_token, completion_mask, ref):
    """TRL's ``DPOTrainer._compute_loss`` on a stand-in trainer: (mean loss, metrics)."""
    model = _FixedModel(per_token)
    trainer = SimpleNamespace(
        model=model,
        accelerator=_Identity(),
        ref_model=None,
        precompute_ref_logps=True,
        aux_loss_enabled=False,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
    )
    ref_chosen, ref_rejected = ref.chunk(2)
    inputs = {
        "input_ids": torch.ones_like(completion_mask),
        "attention_mask": torch.ones_like(completion_mask),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    loss = trl_dpo.DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _ours(loss_fn, per_token, completion_mask, ref):
    counts = completion_mask[:, 1:].sum(dim=1)
    policy = per_token.sum(dim=1)
    if loss_fn.average_log_probs:  # IPO: the recipes pass means over the completion tokens
        policy, ref = policy / counts, ref / counts
    return loss_fn(*policy.chunk(2), *ref.chunk(2))


# TRL 1.16's DPOTrainer ignores label_smoothing for "sigmoid" (conservative DPO is checked against its CPO code below)
CASES = [
    ("sigmoid", 0.1, 0.0),
    ("sigmoid", 0.5, 0.0),
    ("hinge", 0.1, 0.0),
    ("hinge", 0.3, 0.0),
    ("ipo", 0.1, 0.0),
    ("ipo", 0.5, 0.0),
    ("robust", 0.1, 0.1),
    ("robust", 0.5, 0.3),
]


@pytest.mark.parametrize("loss_type, beta, label_smoothing", CASES)
def test_dpo_loss_types_equal_trl(loss_type, beta, label_smoothing):
    per_token, completion_mask, ref = _pairs()
    expected, metrics = _trl_dpo(loss_type, beta, label_smoothing, per_token, completion_mask, ref)
    losses, chosen_rewards, rejected_rewards = _ours(
        DPOLoss(beta=beta, label_smoothing=label_smoothing, loss_type=loss_type), per_token, completion_mask, ref
    )
    assert losses.shape == (NUM_PAIRS,)
    difference = (losses.mean() - expected).abs().item()
    print(
        f"{loss_type} beta={beta} eps={label_smoothing}: loss {losses.mean().item():.9f}, |ours - TRL| {difference:.2e}"
    )
    assert difference <= 1e-12
    if loss_type != "ipo":  # TRL logs summed-log-prob rewards for every loss type; ours are what IPO optimises
        assert chosen_rewards.mean().item() == pytest.approx(metrics["rewards/chosen"], abs=1e-12)
        assert rejected_rewards.mean().item() == pytest.approx(metrics["rewards/rejected"], abs=1e-12)
        accuracy = (chosen_rewards > rejected_rewards).double().mean().item()
        assert accuracy == pytest.approx(metrics["rewards/accuracies"], abs=1e-7)  # TRL's is a float32 mean


@pytest.mark.parametrize("gamma", [0.1, 0.5])
def test_rso_loss_is_trl_hinge(gamma):
    per_token, completion_mask, ref = _pairs(seed=1)
    expected, _ = _trl_dpo("hinge", gamma, 0.0, per_token, completion_mask, ref)
    losses, _, _ = _ours(RSOLoss(gamma=gamma), per_token, completion_mask, ref)
    difference = (losses.mean() - expected).abs().item()
    print(f"RSO gamma={gamma}: |ours - TRL hinge| {difference:.2e}")
    assert difference <= 1e-12


@pytest.mark.parametrize("beta, label_smoothing", [(0.1, 0.1), (0.5, 0.2)])
def test_conservative_dpo_equals_trl_label_smoothed_sigmoid(beta, label_smoothing):
    # TRL 1.16 keeps conservative DPO's formula in CPOTrainer.cpo_loss ("sigmoid" with label_smoothing), over
    # log-probabilities without a reference: given the log-ratios to the reference, it is DPO's loss
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    per_token, completion_mask, ref = _pairs(seed=3)
    policy = per_token.sum(dim=1)
    ratios = policy - ref
    stand_in = SimpleNamespace(
        alpha=0.0, loss_type="sigmoid", beta=beta, label_smoothing=label_smoothing, accelerator=_Identity()
    )
    expected, _, _ = cpo.CPOTrainer.cpo_loss(stand_in, *ratios.chunk(2))
    losses, _, _ = DPOLoss(beta=beta, label_smoothing=label_smoothing)(*policy.chunk(2), *ref.chunk(2))
    difference = (losses - expected).abs().max().item()
    print(f"conservative DPO beta={beta} eps={label_smoothing}: |ours - TRL| {difference:.2e}")
    assert difference <= 1e-12


@pytest.mark.parametrize("beta, gamma, label_smoothing", [(2.0, 0.5, 0.0), (2.5, 1.4, 0.0), (2.0, 0.5, 0.1)])
def test_simpo_equals_trl_cpo_simpo(beta, gamma, label_smoothing):
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    gen = torch.Generator().manual_seed(2)
    chosen, rejected = -torch.rand(2, NUM_PAIRS, generator=gen, dtype=torch.float64) * 2
    stand_in = SimpleNamespace(
        alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=label_smoothing,
        accelerator=_Identity(),
    )  # fmt: skip
    expected = cpo.CPOTrainer.cpo_loss(stand_in, chosen, rejected)
    ours = SimPOLoss(beta=beta, gamma=gamma, label_smoothing=label_smoothing)(chosen, rejected)
    for name, mine, theirs in zip(("losses", "chosen_rewards", "rejected_rewards"), ours, expected):
        difference = (mine - theirs).abs().max().item()
        print(f"SimPO beta={beta} gamma={gamma} eps={label_smoothing} {name}: |ours - TRL| {difference:.2e}")
        assert difference <= 1e-12, name


def test_policy_equal_to_reference_gives_ln2_and_zero_rewards():
    logps = -torch.rand(4, dtype=torch.float64) * 10
    losses, chosen, rejected = DPOLoss()(logps, logps.flip(0), logps, logps.flip(0))
    assert losses == pytest.approx([math.log(2)] * 4, abs=1e-15)
    assert chosen.abs().max() == 0 and rejected.abs().max() == 0


def test_conservative_dpo_is_minimal_at_the_smoothed_margin():
    # -(1 - e) log s(x) - e log s(-x) is minimal at x = log((1 - e) / e): the docstring's claim
    eps = 0.2
    x = torch.linspace(-5, 5, 20001, dtype=torch.float64)
    beta = 0.5
    zeros = torch.zeros_like(x)
    losses, _, _ = DPOLoss(beta=beta, label_smoothing=eps)(x / beta, zeros, zeros, zeros)
    assert x[losses.argmin()].item() == pytest.approx(math.log((1 - eps) / eps), abs=1e-3)


def test_gradients_flow_to_policy_only_and_rewards_are_detached():
    policy = torch.randn(2, 3, requires_grad=True)
    losses, chosen, rejected = DPOLoss(loss_type="robust", label_smoothing=0.1)(*policy, *torch.randn(2, 3))
    assert not chosen.requires_grad and not rejected.requires_grad
    losses.sum().backward()
    assert policy.grad is not None and policy.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(loss_type="kto"), "loss_type must be one of sigmoid, hinge, ipo, robust"),
        (dict(beta=0.0), "beta must be > 0"),
        (dict(label_smoothing=1.5), r"must be in \[0, 1\]"),
        (dict(loss_type="robust", label_smoothing=0.5), "needs label_smoothing < 0.5"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPOLoss(**kwargs)


def test_label_smoothing_without_effect_warns():
    with pytest.warns(UserWarning, match="no effect with loss_type='hinge'"):
        DPOLoss(loss_type="hinge", label_smoothing=0.1)


def test_what_a_training_loop_reads():
    assert not DPOLoss().average_log_probs and DPOLoss(loss_type="ipo").average_log_probs
    assert not DPOLoss().reference_free and not RSOLoss().reference_free
    assert SimPOLoss.reference_free and SimPOLoss.average_log_probs
