"""What preference and RL recipes require of their data, checked once for all of them."""

from typing import Any

# the sample keys of a preference dataset (tune.datasets.PreferenceDataset), chosen and rejected sides
PREFERENCE_KEYS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


def check_preference_dataset(dataset: Any) -> None:
    """The dataset gives preference pairs: its samples hold :data:`PREFERENCE_KEYS`.

    Args:
        dataset (Any): a map-style dataset, e.g. ``tune.datasets.preference_dataset(...)``.

    Raises:
        ValueError: naming the keys found and the builder to use, when a sample lacks one of them (an SFT dataset
            given to a preference recipe, say).
    """
    sample_keys = sorted(dataset[0]) if len(dataset) else []
    if not set(PREFERENCE_KEYS) <= set(sample_keys):
        raise ValueError(
            f"gives samples with keys {sample_keys}; DPO trains on preference pairs ({', '.join(PREFERENCE_KEYS)}). "
            "Use tune.datasets.preference_dataset (or another builder returning a PreferenceDataset)"
        )


def check_prompt_dataset(dataset: Any) -> None:
    """The dataset gives prompts to sample completions of (GRPO): its samples hold ``tokens`` and ``prompt``.

    Args:
        dataset (Any): a map-style dataset, e.g. ``tune.datasets.prompt_dataset(...)``.

    Raises:
        ValueError: naming the keys found and the builders to use, when a sample lacks one of them.
    """
    sample_keys = sorted(dataset[0]) if len(dataset) else []
    if sample_keys and not {"tokens", "prompt"} <= set(sample_keys):
        raise ValueError(
            f"gives samples with keys {sample_keys}; GRPO samples completions of prompts ('tokens' and 'prompt', "
            "plus the columns the rewards read). Use tune.datasets.prompt_dataset or gsm8k_dataset"
        )
