"""Losses: chunked cross-entropy and knowledge-distillation divergences (KL and generalised JSD).

Each averages over non-ignored tokens by default, as torchtune's do, and says so in its ``reduction`` attribute;
tune's recipes ask the cross-entropy losses for ``reduction="sum"`` (the KD losses for ``normalize=False``) and
normalise per training step. Any other loss is read through :func:`loss_reduction` and rescaled by
:class:`ReducedLoss`.
"""

from tune.modules.loss._cross_entropy import CEWithChunkedOutputLoss, LinearCrossEntropyLoss, shift_labels
from tune.modules.loss._kd import (
    ForwardKLLoss,
    ForwardKLWithChunkedOutputLoss,
    GeneralizedJSDLoss,
    GeneralizedJSDWithChunkedOutputLoss,
    ReverseKLLoss,
    ReverseKLWithChunkedOutputLoss,
    SymmetricKLLoss,
    SymmetricKLWithChunkedOutputLoss,
)
from tune.modules.loss._reduction import LOSS_REDUCTIONS, ReducedLoss, loss_reduction

__all__ = [
    "LOSS_REDUCTIONS",
    "CEWithChunkedOutputLoss",
    "ForwardKLLoss",
    "ForwardKLWithChunkedOutputLoss",
    "GeneralizedJSDLoss",
    "GeneralizedJSDWithChunkedOutputLoss",
    "LinearCrossEntropyLoss",
    "ReducedLoss",
    "ReverseKLLoss",
    "ReverseKLWithChunkedOutputLoss",
    "SymmetricKLLoss",
    "SymmetricKLWithChunkedOutputLoss",
    "loss_reduction",
    "shift_labels",
]
