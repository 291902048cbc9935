"""Losses: chunked cross-entropy and knowledge-distillation divergences (KL and generalised JSD).

Each averages over non-ignored tokens by default, as torchtune's do; tune's recipes ask the cross-entropy
losses for ``reduction="sum"`` (the KD losses for ``normalize=False``) and normalise per training step.
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

__all__ = [
    "CEWithChunkedOutputLoss",
    "ForwardKLLoss",
    "ForwardKLWithChunkedOutputLoss",
    "GeneralizedJSDLoss",
    "GeneralizedJSDWithChunkedOutputLoss",
    "LinearCrossEntropyLoss",
    "ReverseKLLoss",
    "ReverseKLWithChunkedOutputLoss",
    "SymmetricKLLoss",
    "SymmetricKLWithChunkedOutputLoss",
    "shift_labels",
]
