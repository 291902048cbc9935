"""Knowledge-distillation losses: KL divergences between a student's and a teacher's token distributions.

Names, signatures and values follow torchtune's ``torchtune.modules.loss`` KD losses, which follow DistiLLM
(Ko et al., 2024, https://arxiv.org/abs/2402.03898). Every loss averages over the tokens whose label is not
``ignore_index`` (0 when there are none); the plain losses take ``normalize=False`` for the sum instead.

"Forward KL" is ``KL(teacher || student)`` without the teacher's entropy: that term does not depend on the student,
so the value is the cross-entropy ``-sum_v p_teacher(v) log p_student(v)`` and the gradient is the KL's.
"Reverse KL" is the full ``KL(student || teacher)``. Vocabulary entries whose logit is infinite (a masked token)
contribute nothing.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # fp32 at least, kept at fp64 for fp64 inputs
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _forward_kl_per_token(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[...]`` values of ``-sum_v p_teacher log p_student``."""
    teacher_probs = F.softmax(_upcast(teacher_logits), dim=-1)
    student_log_probs = F.log_softmax(_upcast(student_logits), dim=-1)
    terms = (teacher_probs * student_log_probs).masked_fill(torch.isinf(student_logits), 0.0)
    return -terms.sum(dim=-1)


def _reverse_kl_per_token(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[...]`` values of ``sum_v p_student (log p_student - log p_teacher)``."""
    student_log_probs = F.log_softmax(_upcast(student_logits), dim=-1)
    teacher_log_probs = F.log_softmax(_upcast(teacher_logits), dim=-1)
    terms = student_log_probs.exp() * (student_log_probs - teacher_log_probs)
    terms = terms.masked_fill(torch.isinf(student_logits) | torch.isinf(teacher_logits), 0.0)
    return terms.sum(dim=-1)


def _symmetric_kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, sym_kd_ratio: float
) -> torch.Tensor:
    forward = _forward_kl_per_token(student_logits, teacher_logits)
    reverse = _reverse_kl_per_token(student_logits, teacher_logits)
    return sym_kd_ratio * forward + (1.0 - sym_kd_ratio) * reverse


def _masked_sum(per_token: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    keep = (labels.reshape(-1) != ignore_index).to(per_token.dtype)
    return (per_token.reshape(-1) * keep).sum()


def _mean(total: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    # 0 rather than nan when every label is ignored
    return total / (labels != ignore_index).sum().clamp(min=1)


def _check_ratio(sym_kd_ratio: float) -> None:
    if not 0.0 <= sym_kd_ratio <= 1.0:
        raise ValueError(f"sym_kd_ratio must be in [0, 1] (1 is forward KL, 0 reverse KL); received {sym_kd_ratio!r}.")


def _check_chunks(num_output_chunks: int) -> None:
    if not isinstance(num_output_chunks, int) or num_output_chunks < 1:
        raise ValueError(f"num_output_chunks must be a positive int; received {num_output_chunks!r}.")


class _KLLoss(nn.Module):
    """Shared forward of the plain KD losses; subclasses define ``_per_token``."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

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
            ValueError: if the two logits differ in shape or do not cover the labels.
        """
        if student_logits.shape != teacher_logits.shape:
            raise ValueError(
                f"student logits {tuple(student_logits.shape)} and teacher logits "
                f"{tuple(teacher_logits.shape)} must have the same shape."
            )
        if student_logits.shape[:-1].numel() != labels.numel():
            raise ValueError(
                f"logits {tuple(student_logits.shape)} score {student_logits.shape[:-1].numel()} tokens but labels "
                f"{tuple(labels.shape)} have {labels.numel()}."
            )
        total = _masked_sum(self._per_token(student_logits, teacher_logits), labels, self.ignore_index)
        return _mean(total, labels, self.ignore_index) if normalize else total


class ForwardKLLoss(_KLLoss):
    """Forward KL divergence ``KL(teacher || student)`` averaged over the tokens whose label is not ignored.

    The teacher's entropy is left out (it is constant for the student), so the value is the cross-entropy
    ``-sum_v p_teacher(v) log p_student(v)`` per token; see the module docstring.

    Args:
        ignore_index (int): label value whose tokens contribute no loss.
    """

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        return _forward_kl_per_token(student_logits, teacher_logits)


class ReverseKLLoss(_KLLoss):
    """Reverse KL divergence ``KL(student || teacher)`` averaged over the tokens whose label is not ignored.

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


class _ChunkedKLLoss(nn.Module):
    """Shared forward of the chunked KD losses: one sequence chunk is upcast and scored at a time."""

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100) -> None:
        super().__init__()
        _check_chunks(num_output_chunks)
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    def _per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        student_logits: list[torch.Tensor] | torch.Tensor,
        teacher_logits: list[torch.Tensor] | torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        """Averages the per-token divergence over the tokens whose label is not ``ignore_index``.

        Args:
            student_logits (list[torch.Tensor] | torch.Tensor): ``[b, s_i, vocab]`` chunks along the sequence (the
                model's chunked output), or one ``[b, s, vocab]`` tensor, split into ``num_output_chunks``.
            teacher_logits (list[torch.Tensor] | torch.Tensor): the teacher's logits, chunked the same way.
            labels (torch.Tensor): ``[b, s]`` shifted labels.

        Returns:
            torch.Tensor: scalar mean loss, fp32 (fp64 for fp64 inputs); 0 when every label is ignored.

        Raises:
            ValueError: if the student's and teacher's chunks differ or do not cover the labels.
        """
        students = self._chunks(student_logits)
        teachers = self._chunks(teacher_logits)
        if [c.shape for c in students] != [c.shape for c in teachers]:
            raise ValueError(
                f"student chunks {[tuple(c.shape) for c in students]} and teacher chunks "
                f"{[tuple(c.shape) for c in teachers]} must have the same shapes."
            )
        seq_len = sum(chunk.shape[1] for chunk in students)
        if seq_len != labels.shape[1]:
            raise ValueError(f"logits cover {seq_len} positions but labels have {labels.shape[1]}.")
        label_chunks = labels.split([chunk.shape[1] for chunk in students], dim=1)
        total = students[0].new_zeros((), dtype=torch.promote_types(students[0].dtype, torch.float32))
        for student, teacher, label_chunk in zip(students, teachers, label_chunks):
            per_token = self._per_token(student, teacher)  # [b, s_i]
            total = total + _masked_sum(per_token, label_chunk, self.ignore_index)
        return _mean(total, labels, self.ignore_index)

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
