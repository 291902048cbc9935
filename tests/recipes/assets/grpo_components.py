"""A user's reward function for the GRPO recipe tests, plugged in by ``_component_: grpo_components.digit_share``."""

import torch


def digit_share(prompts: list[str], completions: list[str], **fields: list) -> torch.Tensor:
    """The share of a completion's characters that are digits: varies between the samples of a random model, so
    the advantages are not all 0."""
    return torch.tensor([sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions])
