"""What knowledge-distillation recipes share: the frozen teacher, the vocabulary check, the losses' setup and the
mix of the distillation loss with the ordinary one.

A distillation step scores the student twice on the same tokens: the cross-entropy against the labels and a
divergence from the teacher's token distribution (``tune.modules.loss.ForwardKLLoss`` and friends). Both are
sums over the step's loss tokens, normalised once per step like every loss in tune, and mixed as
``(1 - kd_ratio) * ce + kd_ratio * kd`` (torchtune's ``kd_ratio``).
"""

import inspect
from collections.abc import Callable

import torch
from torch import nn

from tune.modules.loss import CEWithChunkedOutputLoss, LinearCrossEntropyLoss
from tune.training._compile import compile_loss
from tune.utils import get_logger

log = get_logger(name="tune.training")


def check_kd_ratio(kd_ratio: float) -> None:
    """``kd_ratio`` is a number in ``[0, 1]``: the weight of the distillation loss (0: plain fine-tuning).

    Raises:
        ValueError: otherwise.
    """
    if isinstance(kd_ratio, bool) or not isinstance(kd_ratio, (int, float)) or not 0.0 <= kd_ratio <= 1.0:
        raise ValueError(
            f"must be a number in [0, 1]: the weight of the distillation loss, the cross-entropy getting "
            f"1 - kd_ratio; received {kd_ratio!r}"
        )


def distillation_loss(ce_loss: torch.Tensor, kd_loss: torch.Tensor, kd_ratio: float) -> torch.Tensor:
    """``(1 - kd_ratio) * ce_loss + kd_ratio * kd_loss``: the loss a distillation step minimises.

    Args:
        ce_loss (torch.Tensor): the cross-entropy against the labels (sum or mean over loss tokens).
        kd_loss (torch.Tensor): the divergence from the teacher, reduced the same way.
        kd_ratio (float): weight of ``kd_loss``, in ``[0, 1]``.

    Returns:
        torch.Tensor: the mixed loss.
    """
    return (1.0 - kd_ratio) * ce_loss + kd_ratio * kd_loss


def model_vocab_size(model: nn.Module) -> int | None:
    """The number of logits a model returns per token, read from its modules; None when it cannot be told.

    A tune decoder's token embedding gives it (``tok_embeddings``), or else its output projection (``output``
    with ``out_features`` or a ``[vocab, dim]`` weight).
    """
    embeddings = getattr(model, "tok_embeddings", None)
    if isinstance(embeddings, nn.Embedding):
        return embeddings.num_embeddings
    output = getattr(model, "output", None)
    if isinstance(getattr(output, "out_features", None), int):
        return output.out_features
    weight = getattr(output, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return weight.shape[0]
    return None


def check_same_vocabulary(
    student: nn.Module, teacher: nn.Module, *, student_key: str = "model", teacher_key: str = "teacher_model"
) -> None:
    """The teacher scores the same vocabulary as the student, so that their token distributions can be compared.

    The teacher may be any size (usually a larger model of the same family); only the vocabulary must agree.

    Args:
        student (nn.Module): the model being trained.
        teacher (nn.Module): the frozen teacher.
        student_key (str): the config key that built the student, for the message.
        teacher_key (str): the config key that built the teacher, for the message.

    Raises:
        ValueError: naming both keys and sizes when the vocabularies differ.
    """
    student_vocab, teacher_vocab = model_vocab_size(student), model_vocab_size(teacher)
    if student_vocab is None or teacher_vocab is None or student_vocab == teacher_vocab:
        return  # a model whose vocabulary cannot be read is checked by the KD loss on the first batch
    raise ValueError(
        f"the teacher ({teacher_key}) has a vocabulary of {teacher_vocab} tokens but the student ({student_key}) "
        f"has {student_vocab}: distillation compares their distributions over the same tokens. Pick a teacher "
        f"that shares the student's tokenizer and vocabulary size (in a family whose sizes share one, another "
        f"size of it), or set {student_key} / {teacher_key} vocab_size to match"
    )


def prepare_teacher(teacher: nn.Module) -> nn.Module:
    """Freezes the teacher: evaluation mode (no dropout) and no parameter requiring a gradient.

    Args:
        teacher (nn.Module): the teacher, with its weights loaded.

    Returns:
        nn.Module: the same module, frozen.
    """
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def prepare_kd_ce_loss(loss_fn: nn.Module, *, compile: bool = False) -> nn.Module:
    """Fits the configured cross-entropy (the ``loss`` key) to a distillation recipe.

    It must return the SUM over the loss tokens (the recipes normalise per step), so it is asked for
    ``reduction="sum"``; and it must take logits: the teacher's distribution is compared with the student's
    logits, so the student returns them (a ``LinearCrossEntropyLoss``, which applies the output layer itself, is
    read as the ``CEWithChunkedOutputLoss`` of the same chunks and ignore index).

    Args:
        loss_fn (nn.Module): ``CEWithChunkedOutputLoss`` (torchtune's) or ``LinearCrossEntropyLoss``.
        compile (bool): compile it (``tune.training.compile_loss``).

    Returns:
        nn.Module: the loss to call as ``loss_fn(logits, labels)``.

    Raises:
        ValueError: for another loss.
    """
    if isinstance(loss_fn, LinearCrossEntropyLoss):
        loss_fn = CEWithChunkedOutputLoss(loss_fn.num_output_chunks, loss_fn.ignore_index)
        log.info("loss: LinearCrossEntropyLoss runs as CEWithChunkedOutputLoss (distillation needs the logits).")
    if not isinstance(loss_fn, CEWithChunkedOutputLoss):
        raise ValueError(
            f"{type(loss_fn).__name__} is not supported for distillation; use "
            "tune.modules.loss.CEWithChunkedOutputLoss (the cross-entropy on the student's logits)"
        )
    loss_fn.reduction = "sum"
    if compile:
        compile_loss(loss_fn)
    return loss_fn


def prepare_kd_loss(kd_loss_fn: nn.Module, *, compile: bool = False) -> nn.Module:
    """Checks that the configured distillation loss (the ``kd_loss`` key) can return the sum over the loss tokens.

    Args:
        kd_loss_fn (nn.Module): e.g. ``ForwardKLWithChunkedOutputLoss``: any loss whose forward takes
            ``normalize`` (all of ``tune.modules.loss``'s KD losses).
        compile (bool): compile it (``tune.training.compile_loss``).

    Returns:
        nn.Module: the loss to call as ``kd_loss_fn(student_logits, teacher_logits, labels, normalize=False)``.

    Raises:
        ValueError: when its forward takes no ``normalize`` argument.
    """
    if "normalize" not in _parameters(kd_loss_fn.forward):
        raise ValueError(
            f"{type(kd_loss_fn).__name__}.forward takes no `normalize` argument, so it cannot return the sum the "
            "recipe normalises per step; use one of tune.modules.loss's KD losses (ForwardKLLoss, ReverseKLLoss, "
            "SymmetricKLLoss, GeneralizedJSDLoss or their *WithChunkedOutputLoss variants)"
        )
    if compile:
        compile_loss(kd_loss_fn)
    return kd_loss_fn


def _parameters(function: Callable) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []
