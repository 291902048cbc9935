"""Knowledge-distillation losses: divergences between a student's and a teacher's token distributions.

Names and signatures follow torchtune's ``torchtune.modules.loss`` KD losses (which follow DistiLLM, Ko et al.,
2024, https://arxiv.org/abs/2402.03898); the generalised Jensen-Shannon divergence follows GKD (Agarwal et al.,
2024, https://arxiv.org/abs/2306.13649, Eq. 1) as TRL's ``GKDTrainer.generalized_jsd_loss`` computes it.

Every loss is a true divergence: 0 when the student's logits equal the teacher's, and never negative.

- :class:`ForwardKLLoss`: ``KL(teacher || student) = sum_v p_t(v) (log p_t(v) - log p_s(v))``. torchtune's value
  leaves out the teacher's entropy, i.e. it is the cross-entropy ``-sum_v p_t log p_s``, which is not 0 when the
  student equals the teacher. The entropy does not depend on the student, so the gradients are the same;
  only the logged value differs, by the teacher's mean entropy.
- :class:`ReverseKLLoss`: ``KL(student || teacher)``.
- :class:`SymmetricKLLoss`: ``sym_kd_ratio * forward + (1 - sym_kd_ratio) * reverse``.
- :class:`GeneralizedJSDLoss`: with the mixture ``m = beta * p_t + (1 - beta) * p_s``,
  ``beta * KL(teacher || m) + (1 - beta) * KL(student || m)`` on logits divided by ``temperature``. At the
  ends it is defined as TRL defines it: ``beta = 0`` is the forward KL and ``beta = 1`` the reverse KL (the
  mixture formula itself would give 0 there).

Each averages over the tokens whose label is not ``ignore_index`` (0 when there are none); ``normalize=False``
returns the sum instead (what tune's recipes use, to normalise over all micro-batches of a step). Logits are
upcast to fp32 (fp64 stays fp64). A vocabulary entry whose logit is infinite (a masked token) contributes nothing
to the KL losses: where one side gives it probability 0 and the other does not, the entry is skipped rather than
making the loss infinite, as torchtune does. The ``*WithChunkedOutputLoss`` variants score one sequence chunk at a
time (one chunk upcast at once) and give the same value as the plain ones.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _log_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[..., vocab]`` logits -> log-probabilities in fp32 at least (fp64 stays fp64)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    return F.log_softmax(logits, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``[..., vocab]`` log-probabilities -> ``[...]`` values of ``KL(p || q) = sum_v p (log p - log q)``.

    Entries where either side is infinite are skipped. They are replaced by 0 before the arithmetic, not only
    masked after it, so that no ``0 * inf`` reaches the backward pass (which would make the row's gradient NaN).
    """
    valid = torch.isfinite(log_p) & torch.isfinite(log_q)
    log_p = torch.where(valid, log_p, 0.0)
    log_q = torch.where(valid, log_q, 0.0)
    return torch.where(valid, log_p.exp() * (log_p - log_q), 0.0).sum(dim=-1)


def _forward_kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[...]`` values of ``KL(teacher || student)``."""
    return _kl(_log_probs(teacher_logits, temperature), _log_probs(student_logits, temperature))


def _reverse_kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[...]`` values of ``KL(student || teacher)``."""
    return _kl(_log_probs(student_logits, temperature), _log_probs(teacher_logits, temperature))


def _symmetric_kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, sym_kd_ratio: float
) -> torch.Tensor:
    forward = _forward_kl_per_token(student_logits, teacher_logits)
    reverse = _reverse_kl_per_token(student_logits, teacher_logits)
    return sym_kd_ratio * forward + (1.0 - sym_kd_ratio) * reverse


def _mixture_log_probs(log_s: torch.Tensor, log_t: torch.Tensor, beta: float) -> torch.Tensor:
    """``log(beta * p_t + (1 - beta) * p_s)`` for ``0 < beta < 1``, exactly ``log p_s`` where ``p_s == p_t``.

    Written around the larger of the two terms, ``log p_s + log1p(beta * expm1(log p_t - log p_s))`` (or the
    mirror image), so that the exponent is never positive (no overflow) and equal inputs give ``expm1(0) = 0``
    exactly: a student equal to its teacher scores exactly 0, not a rounding error.
    """
    diff = log_t - log_s
    # each side's exponent is clamped to <= 0: the side torch.where does not pick must stay finite for backward
    around_student = log_s + torch.log1p(beta * torch.expm1(diff.clamp(max=0.0)))
    around_teacher = log_t + torch.log1p((1.0 - beta) * torch.expm1((-diff).clamp(max=0.0)))
    return torch.where(diff <= 0, around_student, around_teacher)


def _generalized_jsd_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float
) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[...]`` values of the generalised JSD (see the module docstring)."""
    if beta == 0.0:
        return _forward_kl_per_token(student_logits, teacher_logits, temperature)
    if beta == 1.0:
        return _reverse_kl_per_token(student_logits, teacher_logits, temperature)
    log_s = _log_probs(student_logits, temperature)
    log_t = _log_probs(teacher_logits, temperature)
    # a masked entry (-inf) becomes a finite floor with probability exp(floor) = 0: the mixture is positive
    # wherever either side is, so every term stays finite and the masked side adds nothing
    floor = torch.finfo(log_s.dtype).min / 4
    log_s, log_t = log_s.clamp(min=floor), log_t.clamp(min=floor)
    log_m = _mixture_log_probs(log_s, log_t, beta)
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)


def _masked_sum(per_token: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    keep = labels.reshape(-1) != ignore_index
    # where, not multiply: a NaN/inf on an ignored (padding) position must not leak into the sum
    kept = torch.where(keep, per_token.reshape(-1), 0.0)
    # the sum over tokens (not over the vocabulary) accumulates in fp64, returned as is: the caller rounds the
    # total once, so one tensor and chunk by chunk give the same value. MPS has no fp64
    accumulate = per_token.dtype if per_token.device.type == "mps" else torch.float64
    return kept.sum(dtype=accumulate)


def _reduce(total: torch.Tensor, labels: torch.Tensor, ignore_index: int, normalize: bool) -> torch.Tensor:
    if not normalize:
        return total
    return total / (labels != ignore_index).sum().clamp(min=1)  # 0 rather than NaN when every label is ignored


def _check_ratio(sym_kd_ratio: float) -> None:
    if not 0.0 <= sym_kd_ratio <= 1.0:
        raise ValueError(f"sym_kd_ratio must be in [0, 1] (1 is forward KL, 0 reverse KL); received {sym_kd_ratio!r}.")


def _check_jsd(beta: float, temperature: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0 is forward KL, 1 reverse KL); received {beta!r}.")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0; received {temperature!r}.")


def _check_chunks(num_output_chunks: int) -> None:
    if not isinstance(num_output_chunks, int) or num_output_chunks < 1:
        raise ValueError(f"num_output_chunks must be a positive int; received {num_output_chunks!r}.")


class _KLLoss(nn.Module):
    """Shared forward of the plain KD losses; subclasses define ``_per_token``."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    @property
    def reduction(self) -> str:
        """``"mean"``: what ``forward`` returns by default (``normalize=False`` gives the sum); read-only."""
        return "mean"

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        student_logits: torch.Tensor,
        teacher_logits: torch.Tensor,
        labels: torch.Tensor,
        normalize: bool = True,
    ) -> torch.Tensor:
        """Scores the student against the teacher on the tokens whose label is not ``ignore_index``.

        Args:
            student_logits (torch.Tensor): ``[b * s, vocab]`` (or ``[b, s, vocab]``) student logits.
            teacher_logits (torch.Tensor): teacher logits of the same shape.
            labels (torch.Tensor): ``[b, s]`` (or flat) shifted labels; only used to select the scored tokens.
            normalize (bool): divide by the number of scored tokens (default) or return the sum.

        Returns:
            torch.Tensor: scalar loss, fp32 (fp64 for fp64 inputs).

        Raises:
            ValueError: if the two logits differ in shape (a teacher with another vocabulary) or do not cover
                the labels.
        """
        if student_logits.shape != teacher_logits.shape:
            raise ValueError(
                f"student logits {tuple(student_logits.shape)} and teacher logits "
                f"{tuple(teacher_logits.shape)} must have the same shape (the same vocabulary)."
            )
        if student_logits.shape[:-1].numel() != labels.numel():
            raise ValueError(
                f"logits {tuple(student_logits.shape)} score {student_logits.shape[:-1].numel()} tokens but labels "
                f"{tuple(labels.shape)} have {labels.numel()}."
            )
        per_token = self._per_token(student_logits, teacher_logits)
        total = _masked_sum(per_token, labels, self.ignore_index).to(per_token.dtype)
        return _reduce(total, labels, self.ignore_index, normalize)


class ForwardKLLoss(_KLLoss):
    """Forward KL divergence ``KL(teacher || student)``, averaged over the tokens whose label is not ignored.

    0 when the student's logits equal the teacher's. torchtune's ``ForwardKLLoss`` returns this plus the
    teacher's mean entropy (its cross-entropy form); the gradients are the same.

    Args:
        ignore_index (int): label value whose tokens contribute no loss.
    """

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _forward_kl_per_token(student_logits, teacher_logits)


class ReverseKLLoss(_KLLoss):
    """Reverse KL divergence ``KL(student || teacher)``, averaged over the tokens whose label is not ignored.

    Args:
        ignore_index (int): label value whose tokens contribute no loss.
    """

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _reverse_kl_per_token(student_logits, teacher_logits)


class SymmetricKLLoss(_KLLoss):
    """``sym_kd_ratio * forward KL + (1 - sym_kd_ratio) * reverse KL``, averaged over the scored tokens.

    Args:
        sym_kd_ratio (float): weight of the forward KL, in ``[0, 1]``: 1 is :class:`ForwardKLLoss`, 0 is
            :class:`ReverseKLLoss`.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: if ``sym_kd_ratio`` is outside ``[0, 1]``.
    """

    def __init__(self, sym_kd_ratio: float = 0.5, ignore_index: int = -100) -> None:
        super().__init__(ignore_index)
        _check_ratio(sym_kd_ratio)
        self.sym_kd_ratio = sym_kd_ratio

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _symmetric_kl_per_token(student_logits, teacher_logits, self.sym_kd_ratio)


class GeneralizedJSDLoss(_KLLoss):
    """Generalised Jensen-Shannon divergence of GKD (Agarwal et al., 2024, Eq. 1), averaged over the scored tokens.

    With ``m = beta * p_teacher + (1 - beta) * p_student`` on ``logits / temperature``, each token scores
    ``beta * KL(teacher || m) + (1 - beta) * KL(student || m)``; ``beta = 0`` is the forward KL
    ``KL(teacher || student)`` and ``beta = 1`` the reverse KL ``KL(student || teacher)``, as in TRL's
    ``GKDTrainer.generalized_jsd_loss`` (whose value this equals; no ``temperature ** 2`` factor).

    Args:
        beta (float): the teacher's weight in the mixture, in ``[0, 1]``.
        temperature (float): divides both logits before the softmax; > 0.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: if ``beta`` is outside ``[0, 1]`` or ``temperature`` is not positive.
    """

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100) -> None:
        super().__init__(ignore_index)
        _check_jsd(beta, temperature)
        self.beta = beta
        self.temperature = temperature

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _generalized_jsd_per_token(student_logits, teacher_logits, self.beta, self.temperature)


class _ChunkedKLLoss(nn.Module):
    """Shared forward of the chunked KD losses: one sequence chunk is upcast and scored at a time."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100) -> None:
        super().__init__()
        _check_chunks(num_output_chunks)
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    @property
    def reduction(self) -> str:
        """``"mean"``: what ``forward`` returns by default (``normalize=False`` gives the sum); read-only."""
        return "mean"

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        student_logits: list[torch.Tensor] | torch.Tensor,
        teacher_logits: list[torch.Tensor] | torch.Tensor,
        labels: torch.Tensor,
        normalize: bool = True,
    ) -> torch.Tensor:
        """Averages (or sums) the per-token divergence over the tokens whose label is not ``ignore_index``.

        Args:
            student_logits (list[torch.Tensor] | torch.Tensor): ``[b, s_i, vocab]`` chunks along the sequence (the
                model's chunked output), or one ``[b, s, vocab]`` tensor, split into ``num_output_chunks``.
            teacher_logits (list[torch.Tensor] | torch.Tensor): the teacher's logits, chunked the same way.
            labels (torch.Tensor): ``[b, s]`` shifted labels.
            normalize (bool): divide by the number of scored tokens (default, torchtune's value) or return the sum.

        Returns:
            torch.Tensor: scalar loss, fp32 (fp64 for fp64 inputs); 0 when every label is ignored.

        Raises:
            ValueError: if the student's and teacher's chunks differ (a teacher with another vocabulary) or do not
                cover the labels.
        """
        students = self._chunks(student_logits)
        teachers = self._chunks(teacher_logits)
        if [c.shape for c in students] != [c.shape for c in teachers]:
            raise ValueError(
                f"student chunks {[tuple(c.shape) for c in students]} and teacher chunks "
                f"{[tuple(c.shape) for c in teachers]} must have the same shapes (the same vocabulary)."
            )
        seq_len = sum(chunk.shape[1] for chunk in students)
        if seq_len != labels.shape[1]:
            raise ValueError(f"logits cover {seq_len} positions but labels have {labels.shape[1]}.")
        label_chunks = labels.split([chunk.shape[1] for chunk in students], dim=1)
        chunk_sums = [
            _masked_sum(self._per_token(student, teacher), label_chunk, self.ignore_index)
            for student, teacher, label_chunk in zip(students, teachers, label_chunks)
        ]
        total = torch.stack(chunk_sums).sum().to(torch.promote_types(students[0].dtype, torch.float32))
        return _reduce(total, labels, self.ignore_index, normalize)

    def _chunks(self, logits: list[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        if isinstance(logits, (list, tuple)):
            return list(logits)
        return list(logits.tensor_split(self.num_output_chunks, dim=1))


class ForwardKLWithChunkedOutputLoss(_ChunkedKLLoss):
    """:class:`ForwardKLLoss` over chunked logits, upcasting one sequence chunk to fp32 at a time.

    Args:
        num_output_chunks (int): number of sequence chunks a single logits tensor is split into.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: for a non-positive ``num_output_chunks``.
    """

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _forward_kl_per_token(student_logits, teacher_logits)


class ReverseKLWithChunkedOutputLoss(_ChunkedKLLoss):
    """:class:`ReverseKLLoss` over chunked logits, upcasting one sequence chunk to fp32 at a time.

    Args:
        num_output_chunks (int): number of sequence chunks a single logits tensor is split into.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: for a non-positive ``num_output_chunks``.
    """

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _reverse_kl_per_token(student_logits, teacher_logits)


class SymmetricKLWithChunkedOutputLoss(_ChunkedKLLoss):
    """:class:`SymmetricKLLoss` over chunked logits, upcasting one sequence chunk to fp32 at a time.

    Args:
        num_output_chunks (int): number of sequence chunks a single logits tensor is split into.
        sym_kd_ratio (float): weight of the forward KL, in ``[0, 1]``.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: for a non-positive ``num_output_chunks`` or ``sym_kd_ratio`` outside ``[0, 1]``.
    """

    def __init__(self, num_output_chunks: int = 8, sym_kd_ratio: float = 0.5, ignore_index: int = -100) -> None:
        super().__init__(num_output_chunks, ignore_index)
        _check_ratio(sym_kd_ratio)
        self.sym_kd_ratio = sym_kd_ratio

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _symmetric_kl_per_token(student_logits, teacher_logits, self.sym_kd_ratio)


class GeneralizedJSDWithChunkedOutputLoss(_ChunkedKLLoss):
    """:class:`GeneralizedJSDLoss` over chunked logits, upcasting one sequence chunk to fp32 at a time.

    Args:
        num_output_chunks (int): number of sequence chunks a single logits tensor is split into.
        beta (float): the teacher's weight in the mixture, in ``[0, 1]`` (0: forward KL, 1: reverse KL).
        temperature (float): divides both logits before the softmax; > 0.
        ignore_index (int): label value whose tokens contribute no loss.

    Raises:
        ValueError: for a non-positive ``num_output_chunks``, ``beta`` outside ``[0, 1]`` or a non-positive
            ``temperature``.
    """

    def __init__(
        self, num_output_chunks: int = 8, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100
    ) -> None:
        super().__init__(num_output_chunks, ignore_index)
        _check_jsd(beta, temperature)
        self.beta = beta
        self.temperature = temperature

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _generalized_jsd_per_token(student_logits, teacher_logits, self.beta, self.temperature)
