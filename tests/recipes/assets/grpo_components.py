"""A user's reward function for the GRPO recipe tests, plugged in by ``_component_: grpo_components.digit_share``."""

import torch


def digit_share(prompts: list[str], completions: list[str], **fields: list) -> torch.Tensor:
    """The share of a completion's characters that are digits: varies between the samples of a random model, so
    the advantages are not all 0."""
    return torch.tensor([sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions])


def completion_length(prompts: list[str], completions: list[str], **fields: list) -> torch.Tensor:
    """A completion's length in characters over 16: the samples of a tiny random model differ in it even when every
    other reward gives them all 0."""
    return torch.tensor([len(text) / 16 for text in completions])
