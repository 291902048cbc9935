"""KTOLoss and kto_kl_estimate against TRL 1.16's ``KTOTrainer._compute_loss`` (the reference implementation, run
on a stand-in trainer whose model returns chosen per-token log-probabilities, with precomputed reference
log-probabilities): the loss, the KL estimate and the reward metrics are equal."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tune.rlhf.loss import KTOLoss, kto_kl_estimate

SEQ_LEN = 5


def _trl_compute_loss(policy, reference, desirable, kl_policy, kl_reference, beta, weights, loss_type):
    """TRL's loss of one batch, and its logged kl and rewards."""
    kto_trainer = pytest.importorskip("trl.trainer.kto_trainer")
    batch_size = policy.shape[0]
    input_ids = torch.ones(batch_size, SEQ_LEN, dtype=torch.long)
    kl_input_ids = torch.ones(batch_size, SEQ_LEN + 1, dtype=torch.long)

    def model(input_ids, **_):
        # the summed log-probability of each row at the first scored position, zeros elsewhere
        values = kl_policy if input_ids.shape[1] == SEQ_LEN + 1 else policy
        per_token = torch.zeros(batch_size, input_ids.shape[1] - 1)
        per_token[:, 0] = values
        return SimpleNamespace(log_probs=per_token, entropy=torch.zeros_like(per_token), mean_logits=per_token)

    calculate_kl = loss_type == "kto"
    stand_in = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x),
        beta=beta, desirable_weight=weights[0], undesirable_weight=weights[1], loss_type=loss_type,
        calculate_KL=calculate_kl, precompute_ref_logps=True, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    stand_in._compute_kl_logps = lambda m, batch: kto_trainer.KTOTrainer._compute_kl_logps(stand_in, m, batch)
    inputs = {
        "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
        "completion_mask": torch.ones_like(input_ids), "label": desirable.clone(), "ref_logps": reference,
    }  # fmt: skip
    if calculate_kl:
        inputs.update(
            KL_input_ids=kl_input_ids, KL_attention_mask=torch.ones_like(kl_input_ids),
            KL_completion_mask=torch.ones_like(kl_input_ids), ref_KL_logps=kl_reference,
        )  # fmt: skip
    loss = kto_trainer.KTOTrainer._compute_loss(stand_in, model, inputs, return_outputs=False)
    return loss, {key: values[-1] for key, values in stand_in._metrics["train"].items()}


CASES = [
    pytest.param(flags, weights, loss_type, kl_shift, id=f"{loss_type}-{name}-w{weights[0]}-{weights[1]}-kl{kl_shift}")
    for loss_type in ("kto", "apo_zero_unpaired")
    for name, flags in [
        ("mixed", [True, False, True, True, False, False]),
        ("desirable_only", [True] * 4),
        ("undesirable_only", [False] * 3),
    ]
    for weights in [(1.0, 1.0), (1.33, 0.7)]
    for kl_shift in (1.5, -1.5)  # a positive KL estimate, and a negative one (clamped to 0)
]


@pytest.mark.parametrize("flags, weights, loss_type, kl_shift", CASES)
def test_loss_and_kl_equal_trl(flags, weights, loss_type, kl_shift):
    generator = torch.Generator().manual_seed(len(flags) + int(10 * weights[0]))
    size = len(flags)
    policy = -10 + 4 * torch.rand(size, generator=generator, dtype=torch.float64).float()
    reference = policy - torch.randn(size, generator=generator)
    kl_policy = -12 + 4 * torch.rand(size, generator=generator)
    kl_reference = kl_policy - kl_shift + 0.3 * torch.randn(size, generator=generator)
    desirable = torch.tensor(flags)
    beta = 0.2

    trl_loss, trl_metrics = _trl_compute_loss(
        policy, reference, desirable, kl_policy, kl_reference, beta, weights, loss_type
    )
    loss_fn = KTOLoss(beta=beta, desirable_weight=weights[0], undesirable_weight=weights[1], loss_type=loss_type)
    kl = kto_kl_estimate((kl_policy - kl_reference).sum(), size) if loss_fn.needs_kl else None
    losses, rewards = loss_fn(policy, reference, desirable, kl)
    print(f"{loss_type} {flags} {weights}: tune {losses.mean().item():.8f}, TRL {trl_loss.item():.8f}")
    torch.testing.assert_close(losses.mean(), trl_loss, atol=1e-7, rtol=1e-6)
    if loss_fn.needs_kl:
        assert kl.item() == pytest.approx(trl_metrics["kl"], abs=1e-6)
        assert (kl.item() == 0) == (kl_shift < 0)
    if any(flags):
        assert rewards[desirable].mean().item() == pytest.approx(trl_metrics["rewards/chosen"], abs=1e-6)
    if not all(flags):
        assert rewards[~desirable].mean().item() == pytest.approx(trl_metrics["rewards/rejected"], abs=1e-6)
    assert not rewards.requires_grad


def test_gradient_flows_to_the_policy_only_and_kl_is_detached():
    policy = torch.tensor([-3.0, -4.0], requires_grad=True)
    kl_sum = torch.tensor(2.0, requires_grad=True)
    kl = kto_kl_estimate(kl_sum, 2)
    losses, _ = KTOLoss()(policy, torch.tensor([-3.5, -3.0]), torch.tensor([True, False]), kl)
    losses.sum().backward()
    assert policy.grad is not None and policy.grad[0] < 0 < policy.grad[1]  # raise desirable, lower undesirable
    assert kl_sum.grad is None and not kl.requires_grad and kl.item() == 1.0


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="loss_type must be one of kto, apo_zero_unpaired"):
        KTOLoss(loss_type="sigmoid")
    with pytest.raises(ValueError, match="beta must be > 0"):
        KTOLoss(beta=0)
    with pytest.raises(ValueError, match="needs the KL estimate"):
        KTOLoss()(torch.zeros(2), torch.zeros(2), torch.tensor([True, False]))
    assert kto_kl_estimate(torch.tensor(0.0), 0).item() == 0.0  # no KL row: no division by zero
