"""A loss's declared reduction (``loss_reduction``) and the rescaling between a mean and a sum (``ReducedLoss``).

Expected values are ``F.cross_entropy`` on the same logits with ``reduction="sum"``, written out in each test.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.modules.loss import (
    CEWithChunkedOutputLoss,
    ForwardKLLoss,
    ForwardKLWithChunkedOutputLoss,
    GeneralizedJSDLoss,
    GeneralizedJSDWithChunkedOutputLoss,
    LinearCrossEntropyLoss,
    ReducedLoss,
    ReverseKLLoss,
    ReverseKLWithChunkedOutputLoss,
    SymmetricKLLoss,
    SymmetricKLWithChunkedOutputLoss,
    _reduction,
    loss_reduction,
)

IGNORE = -100
VOCAB = 12


class TorchtuneStyleMeanLoss(nn.Module):
    """A user's loss written for torchtune: the mean over the scored tokens, no ``reduction`` attribute."""

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


class UserSumLoss(nn.Module):
    """A user's loss that returns the sum and says so."""

    reduction = "sum"

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE, reduction="sum")


def _logits_and_labels(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 7, VOCAB, generator=generator, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 7), generator=generator)
    labels[0, :2] = IGNORE  # a masked prompt
    labels[1, 5:] = IGNORE  # padding
    return logits, labels


def _summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")


@pytest.fixture(autouse=True)
def _forget_reported_classes():
    # each test sees the one-time info line of a class as a fresh run would
    _reduction._reported_undeclared.clear()
    yield
    _reduction._reported_undeclared.clear()


# ------------------------------------------------------------------------------------------ loss_reduction


@pytest.mark.parametrize("cls", [CEWithChunkedOutputLoss, LinearCrossEntropyLoss])
def test_tune_cross_entropy_losses_declare_a_mean_by_default_and_a_sum_when_asked(cls, caplog):
    with caplog.at_level(logging.INFO, logger="tune"):
        assert loss_reduction(cls()) == "mean"  # torchtune's meaning of the name
        assert loss_reduction(cls(reduction="sum")) == "sum"
    assert "declares no `reduction`" not in caplog.text


@pytest.mark.parametrize(
    "cls",
    [
        ForwardKLLoss,
        ReverseKLLoss,
        SymmetricKLLoss,
        GeneralizedJSDLoss,
        ForwardKLWithChunkedOutputLoss,
        ReverseKLWithChunkedOutputLoss,
        SymmetricKLWithChunkedOutputLoss,
        GeneralizedJSDWithChunkedOutputLoss,
    ],
)
def test_distillation_losses_declare_the_mean_their_forward_returns_by_default(cls, caplog):
    loss_fn = cls()
    with caplog.at_level(logging.INFO, logger="tune"):
        assert loss_reduction(loss_fn) == "mean"
    assert "declares no `reduction`" not in caplog.text
    with pytest.raises(AttributeError):  # the forward's `normalize` argument chooses the sum, not this attribute
        loss_fn.reduction = "sum"


def test_plain_torch_cross_entropy_declares_its_reduction():
    assert loss_reduction(nn.CrossEntropyLoss()) == "mean"
    assert loss_reduction(nn.CrossEntropyLoss(reduction="mean")) == "mean"
    assert loss_reduction(nn.CrossEntropyLoss(reduction="sum")) == "sum"


def test_reduction_none_is_an_error_naming_the_loss_and_the_fix():
    with pytest.raises(ValueError) as error:
        loss_reduction(nn.CrossEntropyLoss(reduction="none"))
    assert str(error.value) == (
        "loss: torch.nn.modules.loss.CrossEntropyLoss.reduction is 'none'; a training loss returns one number per "
        "micro-batch, its 'mean' over the non-ignored labels or their 'sum'. Set loss.reduction to 'mean' or 'sum'."
    )


def test_a_user_loss_without_the_attribute_is_a_mean_said_once(caplog):
    with caplog.at_level(logging.INFO, logger="tune"):
        assert loss_reduction(TorchtuneStyleMeanLoss()) == "mean"
        assert loss_reduction(TorchtuneStyleMeanLoss()) == "mean"
    lines = [r.getMessage() for r in caplog.records if "declares no `reduction`" in r.getMessage()]
    assert lines == [
        f"loss: {__name__}.TorchtuneStyleMeanLoss declares no `reduction`, so its value is taken as the MEAN over "
        "the non-ignored labels (torchtune's convention). If it returns the sum over tokens, set "
        '`reduction = "sum"` on the class.'
    ]


def test_a_user_loss_declaring_a_sum_is_a_sum():
    assert loss_reduction(UserSumLoss()) == "sum"


# --------------------------------------------------------------------------------------------- ReducedLoss


def test_a_mean_times_the_scored_labels_is_the_sum_with_the_sum_s_gradient():
    logits, labels = _logits_and_labels()
    expected = _summed_cross_entropy(logits, labels)
    (expected_grad,) = torch.autograd.grad(expected, logits)

    loss = ReducedLoss(TorchtuneStyleMeanLoss(), from_reduction="mean", reduction="sum")(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    assert int((labels != IGNORE).sum()) == 10  # 5 + 5: the count the mean is multiplied by
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)


def test_a_sum_divided_by_the_scored_labels_is_the_mean():
    logits, labels = _logits_and_labels(1)
    loss = ReducedLoss(UserSumLoss(), from_reduction="sum", reduction="mean")(logits, labels)
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)


def test_the_loss_s_own_ignore_index_is_used():
    logits, labels = _logits_and_labels(2)
    labels[labels == IGNORE] = -1
    loss_fn = ReducedLoss(nn.CrossEntropyLoss(ignore_index=-1), from_reduction="mean")
    assert loss_fn.ignore_index == -1
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-1, reduction="sum")
    torch.testing.assert_close(loss_fn(logits.reshape(-1, VOCAB), labels.reshape(-1)), expected, rtol=0, atol=1e-5)


def test_without_an_ignore_index_attribute_tune_s_is_used():
    assert ReducedLoss(TorchtuneStyleMeanLoss(), from_reduction="mean").ignore_index == CROSS_ENTROPY_IGNORE_IDX


def test_a_micro_batch_without_scored_labels_adds_zero_and_no_nan_gradient():
    logits, labels = _logits_and_labels()
    labels[:] = IGNORE
    loss = ReducedLoss(TorchtuneStyleMeanLoss(), from_reduction="mean")(logits, labels)
    loss.backward()
    assert loss.item() == 0.0  # the mean itself is NaN here
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_unknown_reductions_are_refused():
    with pytest.raises(ValueError, match=r"reduction must be one of \('sum', 'mean'\); received 'none'"):
        ReducedLoss(TorchtuneStyleMeanLoss(), from_reduction="none")
