"""tune/training/_distillation.py: the knowledge-distillation policy the KD recipes share."""

import pytest
import torch
from torch import nn

from tune.models.llama2 import llama2
from tune.modules.loss import (
    CEWithChunkedOutputLoss,
    ForwardKLWithChunkedOutputLoss,
    GeneralizedJSDLoss,
    LinearCrossEntropyLoss,
)
from tune.training import (
    check_kd_ratio,
    check_same_vocabulary,
    distillation_loss,
    model_vocab_size,
    prepare_kd_ce_loss,
    prepare_kd_loss,
    prepare_teacher,
)


def _decoder(vocab_size: int, num_layers: int = 1) -> nn.Module:
    return llama2(
        vocab_size=vocab_size, num_layers=num_layers, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=32
    )


def test_kd_ratio_must_be_a_number_in_0_1():
    for ok in (0, 0.0, 0.5, 1, 1.0):
        check_kd_ratio(ok)
    for bad in (-0.1, 1.5, "0.5", None, True):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            check_kd_ratio(bad)


def test_distillation_loss_mixes_cross_entropy_and_kd_with_kd_ratio():
    ce, kd = torch.tensor(4.0), torch.tensor(2.0)
    assert distillation_loss(ce, kd, 0.25).item() == 0.75 * 4.0 + 0.25 * 2.0
    assert distillation_loss(ce, kd, 0.0).item() == 4.0
    assert distillation_loss(ce, kd, 1.0).item() == 2.0


def test_vocabulary_is_read_from_the_model_and_a_mismatch_names_both_config_keys():
    student, larger_teacher = _decoder(64), _decoder(64, num_layers=2)
    assert model_vocab_size(student) == 64
    check_same_vocabulary(student, larger_teacher)  # another size, same vocabulary: fine

    class OutputOnly(nn.Module):  # a user's model: the output projection tells the vocabulary
        def __init__(self):
            super().__init__()
            self.output = nn.Linear(8, 48)

    assert model_vocab_size(OutputOnly()) == 48
    assert model_vocab_size(nn.Identity()) is None
    check_same_vocabulary(student, nn.Identity())  # unknown: left to the loss's shape check
    with pytest.raises(ValueError) as err:
        check_same_vocabulary(student, _decoder(96))
    message = str(err.value)
    assert "teacher_model" in message and "96" in message and "(model) has 64" in message


def test_prepare_teacher_freezes_it():
    teacher = _decoder(32).train()
    assert prepare_teacher(teacher) is teacher
    assert not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())


def test_the_losses_are_asked_for_sums_on_the_logits():
    ce = prepare_kd_ce_loss(CEWithChunkedOutputLoss(num_output_chunks=4))
    assert ce.reduction == "sum"
    # the fused loss projects hidden states itself; distillation needs the logits: the chunked CE instead
    ce = prepare_kd_ce_loss(LinearCrossEntropyLoss(num_output_chunks=2, ignore_index=-1))
    assert type(ce) is CEWithChunkedOutputLoss and ce.reduction == "sum"
    assert (ce.num_output_chunks, ce.ignore_index) == (2, -1)
    with pytest.raises(ValueError, match="CrossEntropyLoss is not supported"):
        prepare_kd_ce_loss(nn.CrossEntropyLoss())

    for kd in (ForwardKLWithChunkedOutputLoss(), GeneralizedJSDLoss()):
        assert prepare_kd_loss(kd) is kd

    class MeanOnlyKD(nn.Module):
        def forward(self, student_logits, teacher_logits, labels):
            return torch.zeros(())

    with pytest.raises(ValueError, match="MeanOnlyKD.forward takes no `normalize`"):
        prepare_kd_loss(MeanOnlyKD())
