"""KD losses against plain PyTorch: ``F.cross_entropy`` with soft targets (forward) and ``F.kl_div`` (reverse)."""

import pytest
import torch
import torch.nn.functional as F

from tune.modules.loss import (
    ForwardKLLoss,
    ForwardKLWithChunkedOutputLoss,
    ReverseKLLoss,
    ReverseKLWithChunkedOutputLoss,
    SymmetricKLLoss,
    SymmetricKLWithChunkedOutputLoss,
)

IGNORE = -100


def _data(batch=2, seq=7, vocab=11):
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(batch, seq, vocab, generator=gen)
    teacher = torch.randn(batch, seq, vocab, generator=gen) * 2
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    labels[0, 5:] = IGNORE
    labels[1, :2] = IGNORE
    return student, teacher, labels


def _reference_per_token(student, teacher, kind):
    flat_s, flat_t = student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1])
    # forward: cross-entropy of the student against the teacher's distribution (KL minus the teacher's entropy)
    forward = F.cross_entropy(flat_s, F.softmax(flat_t, dim=-1), reduction="none")
    # reverse: KL(student || teacher) = sum p_s (log p_s - log p_t)
    log_s, log_t = F.log_softmax(flat_s, dim=-1), F.log_softmax(flat_t, dim=-1)
    reverse = F.kl_div(log_t, log_s, log_target=True, reduction="none").sum(-1)
    return {"forward": forward, "reverse": reverse, "symmetric": 0.3 * forward + 0.7 * reverse}[kind]


PLAIN = {
    "forward": lambda: ForwardKLLoss(),
    "reverse": lambda: ReverseKLLoss(),
    "symmetric": lambda: SymmetricKLLoss(sym_kd_ratio=0.3),
}
CHUNKED = {
    "forward": lambda: ForwardKLWithChunkedOutputLoss(num_output_chunks=3),
    "reverse": lambda: ReverseKLWithChunkedOutputLoss(num_output_chunks=3),
    "symmetric": lambda: SymmetricKLWithChunkedOutputLoss(num_output_chunks=3, sym_kd_ratio=0.3),
}


@pytest.mark.parametrize("kind", ["forward", "reverse", "symmetric"])
def test_kd_losses_average_plain_pytorch_divergences_over_unignored_tokens(kind):
    student, teacher, labels = _data()
    keep = labels.reshape(-1) != IGNORE
    per_token = _reference_per_token(student, teacher, kind)
    want_sum = per_token[keep].sum()
    want_mean = want_sum / keep.sum()

    plain = PLAIN[kind]()
    flat_s, flat_t = student.reshape(-1, 11), teacher.reshape(-1, 11)  # torchtune's [b * s, vocab] layout
    torch.testing.assert_close(plain(flat_s, flat_t, labels), want_mean)
    torch.testing.assert_close(plain(flat_s, flat_t, labels, normalize=False), want_sum)

    chunked = CHUNKED[kind]()
    chunks_s, chunks_t = list(student.chunk(3, dim=1)), list(teacher.chunk(3, dim=1))
    torch.testing.assert_close(chunked(chunks_s, chunks_t, labels), want_mean)
    torch.testing.assert_close(chunked(student, teacher, labels), want_mean)  # one tensor, split by the loss

    # the student's gradient agrees with the reference's
    student_grad = student.clone().requires_grad_(True)
    chunked(list(student_grad.chunk(3, dim=1)), chunks_t, labels).backward()
    student_ref = student.clone().requires_grad_(True)
    (_reference_per_token(student_ref, teacher, kind)[keep].sum() / keep.sum()).backward()
    torch.testing.assert_close(student_grad.grad, student_ref.grad)


def test_kd_losses_skip_infinite_logits_and_return_zero_without_scored_tokens():
    student, teacher, labels = _data()
    masked = student.clone()
    masked[..., 0] = -float("inf")  # a vocabulary entry the student may never emit
    for loss_fn in (ForwardKLLoss(), ReverseKLLoss(), SymmetricKLLoss()):
        assert torch.isfinite(loss_fn(masked, teacher, labels))
    all_ignored = torch.full_like(labels, IGNORE)
    for loss_fn in (ForwardKLLoss(), ReverseKLWithChunkedOutputLoss(), SymmetricKLWithChunkedOutputLoss()):
        assert loss_fn(student, teacher, all_ignored).item() == 0.0


def test_kd_losses_reject_bad_arguments():
    student, teacher, labels = _data()
    with pytest.raises(ValueError, match="sym_kd_ratio"):
        SymmetricKLLoss(sym_kd_ratio=1.5)
    with pytest.raises(ValueError, match="sym_kd_ratio"):
        SymmetricKLWithChunkedOutputLoss(sym_kd_ratio=-0.1)
    with pytest.raises(ValueError, match="same shape"):
        ForwardKLLoss()(student, teacher[:, :3], labels)
    with pytest.raises(ValueError, match="positions"):
        ForwardKLWithChunkedOutputLoss(2)(student, teacher, labels[:, :4])
