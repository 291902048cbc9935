from collections.abc import Callable
from typing import Any

from tune.data import ModelTokenizer
from tune.datasets._preference import PreferenceDataset, preference_dataset


def hh_rlhf_helpful_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = "RLHFlow/HH-RLHF-Helpful-standard",
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> PreferenceDataset:
    """The helpful subset of Anthropic's HH-RLHF in the standard layout (``RLHFlow/HH-RLHF-Helpful-standard``):
    columns ``chosen`` and ``rejected``, each a list of ``{"role": ..., "content": ...}`` turns.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
            Default ``"RLHFlow/HH-RLHF-Helpful-standard"``.
        column_map (dict[str, str] | None): maps ``chosen``/``rejected`` to column names.
        train_on_input (bool): compute loss on the prompt turns too. Default False.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        PreferenceDataset: the tokenised pairs.

    Raises:
        ValueError: see :class:`~tune.datasets.PreferenceDataset`.
    """
    return preference_dataset(
        tokenizer, source=source, column_map=column_map, train_on_input=train_on_input,
        new_system_prompt=new_system_prompt, filter_fn=filter_fn, split=split, num_proc=num_proc,
        **load_dataset_kwargs,
    )  # fmt: skip
