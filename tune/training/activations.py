"""torchtune's ``training.activations`` module path: activation checkpointing applied from outside the model."""

from tune.training._activations import apply_activation_checkpointing, apply_selective_activation_checkpointing

__all__ = ["apply_activation_checkpointing", "apply_selective_activation_checkpointing"]
