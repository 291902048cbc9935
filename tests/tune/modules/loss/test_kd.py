"""KD losses against independent references: ``F.kl_div`` for the KL divergences, torchtune's cross-entropy form
of the forward KL for its gradients, and TRL's ``GKDTrainer.generalized_jsd_loss`` for the generalised JSD."""

import pytest
import torch
import torch.nn.functional as F

from tune.modules.loss import (
    ForwardKLLoss,
    ForwardKLWithChunkedOutputLoss,
    GeneralizedJSDLoss,
    GeneralizedJSDWithChunkedOutputLoss,
    ReverseKLLoss,
    ReverseKLWithChunkedOutputLoss,
    SymmetricKLLoss,
    SymmetricKLWithChunkedOutputLoss,
)

IGNORE = -100
VOCAB = 11


def _data(batch=2, seq=7, vocab=VOCAB, seed=0):
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, seq, vocab, generator=gen)
    teacher = torch.randn(batch, seq, vocab, generator=gen) * 2
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    labels[0, 5:] = IGNORE
    labels[1, :2] = IGNORE
    return student, teacher, labels


def _kl_div(log_p, log_q):
    """KL(p || q) per row with PyTorch's own ``F.kl_div`` (its arguments are (log q, log p))."""
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


def _reference_per_token(student, teacher, kind):
    flat_s, flat_t = student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1])
    log_s, log_t = F.log_softmax(flat_s, dim=-1), F.log_softmax(flat_t, dim=-1)
    forward, reverse = _kl_div(log_t, log_s), _kl_div(log_s, log_t)
    return {"forward": forward, "reverse": reverse, "symmetric": 0.3 * forward + 0.7 * reverse}[kind]


PLAIN = {
    "forward": lambda: ForwardKLLoss(),
    "reverse": lambda: ReverseKLLoss(),
    "symmetric": lambda: SymmetricKLLoss(sym_kd_ratio=0.3),
    "jsd": lambda: GeneralizedJSDLoss(beta=0.3, temperature=1.5),
}
CHUNKED = {
    "forward": lambda: ForwardKLWithChunkedOutputLoss(num_output_chunks=3),
    "reverse": lambda: ReverseKLWithChunkedOutputLoss(num_output_chunks=3),
    "symmetric": lambda: SymmetricKLWithChunkedOutputLoss(num_output_chunks=3, sym_kd_ratio=0.3),
    "jsd": lambda: GeneralizedJSDWithChunkedOutputLoss(num_output_chunks=3, beta=0.3, temperature=1.5),
}


@pytest.mark.parametrize("kind", ["forward", "reverse", "symmetric"])
def test_kd_losses_average_plain_pytorch_divergences_over_unignored_tokens(kind):
    student, teacher, labels = _data()
    keep = labels.reshape(-1) != IGNORE
    per_token = _reference_per_token(student, teacher, kind)
    want_sum = per_token[keep].sum()
    want_mean = want_sum / keep.sum()

    plain = PLAIN[kind]()
    flat_s, flat_t = student.reshape(-1, VOCAB), teacher.reshape(-1, VOCAB)  # torchtune's [b * s, vocab] layout
    torch.testing.assert_close(plain(flat_s, flat_t, labels), want_mean)
    torch.testing.assert_close(plain(flat_s, flat_t, labels, normalize=False), want_sum)

    chunked = CHUNKED[kind]()
    chunks_s, chunks_t = list(student.chunk(3, dim=1)), list(teacher.chunk(3, dim=1))
    torch.testing.assert_close(chunked(chunks_s, chunks_t, labels), want_mean)
    torch.testing.assert_close(chunked(student, teacher, labels), want_mean)  # one tensor, split by the loss
    torch.testing.assert_close(chunked(student, teacher, labels, normalize=False), want_sum)

    # the student's gradient agrees with the reference's
    student_grad = student.clone().requires_grad_(True)
    chunked(list(student_grad.chunk(3, dim=1)), chunks_t, labels).backward()
    student_ref = student.clone().requires_grad_(True)
    (_reference_per_token(student_ref, teacher, kind)[keep].sum() / keep.sum()).backward()
    torch.testing.assert_close(student_grad.grad, student_ref.grad)


ALL_LOSSES = {
    **{f"{kind}": make for kind, make in PLAIN.items()},
    **{f"{kind}-chunked": make for kind, make in CHUNKED.items()},
    "symmetric-forward-only": lambda: SymmetricKLLoss(sym_kd_ratio=1.0),
    **{f"jsd-beta{b}": (lambda b=b: GeneralizedJSDLoss(beta=b, temperature=2.0)) for b in (0.0, 0.5, 1.0)},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(ALL_LOSSES))
def test_every_kd_loss_is_exactly_zero_when_the_student_equals_the_teacher(name, dtype):
    # a true divergence: torchtune's forward KL is the teacher's entropy here (about 1.6 nats on these logits)
    _, teacher, labels = _data(vocab=VOCAB)
    teacher = teacher.to(dtype)
    loss = ALL_LOSSES[name]()(teacher.clone(), teacher, labels)
    assert loss.dtype == torch.float32  # upcast
    assert loss.item() == 0.0


def test_forward_kl_has_the_gradients_of_torchtunes_cross_entropy_form():
    """torchtune's ForwardKLLoss value is -sum p_t log p_s (KL plus the teacher's entropy): same gradients as ours,
    value larger by the teacher's mean entropy over the scored tokens."""
    student, teacher, labels = _data()
    keep = labels.reshape(-1) != IGNORE
    flat_t = teacher.reshape(-1, VOCAB)

    ours = student.clone().requires_grad_(True)
    value = ForwardKLLoss()(ours, teacher, labels)
    value.backward()

    theirs = student.clone().requires_grad_(True)
    cross_entropy = F.cross_entropy(theirs.reshape(-1, VOCAB), F.softmax(flat_t, -1), reduction="none")[keep]
    cross_entropy.mean().backward()
    print("max |grad(KL) - grad(cross-entropy form)|:", (ours.grad - theirs.grad).abs().max().item())
    torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-7, rtol=0)

    entropy = -(F.softmax(flat_t, -1) * F.log_softmax(flat_t, -1)).sum(-1)[keep].mean()
    torch.testing.assert_close(value + entropy, cross_entropy.mean().detach())


@pytest.mark.parametrize("kind", sorted(PLAIN))
def test_chunked_equals_unchunked_within_1e_6(kind):
    # bigger than _data: long sequences, uneven chunks, bf16 logits as a model in bf16 returns them
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(3, 50, 97, generator=gen) * 3
    teacher = torch.randn(3, 50, 97, generator=gen) * 3
    labels = torch.randint(0, 97, (3, 50), generator=gen)
    labels[:, :10] = IGNORE
    labels[2, 30:] = IGNORE
    worst = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        s, t = student.to(dtype), teacher.to(dtype)
        for normalize in (True, False):
            plain = PLAIN[kind]()(s, t, labels, normalize=normalize)
            for chunks in (1, 4, 7):
                chunked = CHUNKED[kind]()
                chunked.num_output_chunks = chunks
                value = chunked(s, t, labels, normalize=normalize)
                scale = 1.0 if normalize else (labels != IGNORE).sum().item()  # a sum: 1e-6 per scored token
                worst = max(worst, (value - plain).abs().item() / scale)
    print(f"{kind}: max |chunked - unchunked| per token: {worst:.2e}")
    assert worst <= 1e-6


@pytest.mark.parametrize("kind", sorted(PLAIN))
def test_kd_losses_skip_masked_vocabulary_entries_with_finite_values_and_gradients(kind):
    student, teacher, labels = _data()
    masked_student, masked_teacher = student.clone(), teacher.clone()
    masked_student[..., 0] = -float("inf")  # a vocabulary entry the student may never emit
    masked_teacher[..., 1] = -float("inf")
    masked_student.requires_grad_(True)
    loss = PLAIN[kind]()(masked_student, masked_teacher, labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(masked_student.grad).all()


def test_kd_losses_return_zero_without_scored_tokens():
    student, teacher, labels = _data()
    all_ignored = torch.full_like(labels, IGNORE)
    for make in [*PLAIN.values(), *CHUNKED.values()]:
        assert make()(student, teacher, all_ignored).item() == 0.0


def test_kd_losses_reject_bad_arguments():
    student, teacher, labels = _data()
    with pytest.raises(ValueError, match="sym_kd_ratio"):
        SymmetricKLLoss(sym_kd_ratio=1.5)
    with pytest.raises(ValueError, match="sym_kd_ratio"):
        SymmetricKLWithChunkedOutputLoss(sym_kd_ratio=-0.1)
    with pytest.raises(ValueError, match="beta"):
        GeneralizedJSDLoss(beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        GeneralizedJSDWithChunkedOutputLoss(temperature=0.0)
    with pytest.raises(ValueError, match="same vocabulary"):
        ForwardKLLoss()(student, teacher[..., :5], labels)
    with pytest.raises(ValueError, match="same vocabulary"):
        GeneralizedJSDWithChunkedOutputLoss(2)(student, teacher[..., :5], labels)
    with pytest.raises(ValueError, match="positions"):
        ForwardKLWithChunkedOutputLoss(2)(student, teacher, labels[:, :4])


@pytest.fixture(scope="module")
def trl_generalized_jsd():
    pytest.importorskip("trl")
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.gkd import GKDTrainer

    return GKDTrainer.generalized_jsd_loss


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_equals_trl_gkd(trl_generalized_jsd, beta, temperature):
    """TRL 1.16's generalized_jsd_loss with labels: the sum over scored tokens and the vocabulary, divided by the
    number of scored tokens ("batchmean"), our mean; with ``num_items_in_batch`` it is the sum divided by that."""
    student, teacher, labels = _data(batch=3, seq=9, vocab=23, seed=2)
    num_tokens = (labels != IGNORE).sum()
    want = trl_generalized_jsd(student, teacher, labels=labels, beta=beta, temperature=temperature)
    want_sum = trl_generalized_jsd(
        student, teacher, labels=labels, beta=beta, temperature=temperature, num_items_in_batch=1
    )

    plain = GeneralizedJSDLoss(beta=beta, temperature=temperature)
    chunked = GeneralizedJSDWithChunkedOutputLoss(num_output_chunks=4, beta=beta, temperature=temperature)
    ours = plain(student, teacher, labels)
    diff = max((ours - want).abs().item(), (chunked(student, teacher, labels) - want).abs().item())
    print(f"beta={beta} T={temperature}: ours {ours.item():.7f} TRL {want.item():.7f} max |diff| {diff:.1e}")
    assert diff <= 1e-6
    torch.testing.assert_close(plain(student, teacher, labels, normalize=False), want_sum, atol=1e-5, rtol=1e-6)
    assert num_tokens > 0 and want > 0

    # and the same gradient
    ours_grad = student.clone().requires_grad_(True)
    plain(ours_grad, teacher, labels).backward()
    trl_grad = student.clone().requires_grad_(True)
    trl_generalized_jsd(trl_grad, teacher, labels=labels, beta=beta, temperature=temperature).backward()
    torch.testing.assert_close(ours_grad.grad, trl_grad.grad, atol=1e-7, rtol=1e-5)
