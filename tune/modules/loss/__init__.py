"""Losses shared by every recipe. They return summed token losses; normalisation is per training step."""

from tune.modules.loss._cross_entropy import CEWithChunkedOutputLoss, LinearCrossEntropyLoss, shift_labels

__all__ = ["CEWithChunkedOutputLoss", "LinearCrossEntropyLoss", "shift_labels"]
