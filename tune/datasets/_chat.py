from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import ModelTokenizer, OpenAIToMessages, ShareGPTToMessages
from tune.datasets._packed import maybe_pack
from tune.datasets._sft import SFTDataset

_STYLES = {"sharegpt": (ShareGPTToMessages, "conversations"), "openai": (OpenAIToMessages, "messages")}


def chat_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    conversation_column: str,
    conversation_style: str,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    masking_strategy: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Multi-turn conversations stored in one column.

    ``conversation_style="sharegpt"``: turns ``{"from": "system"|"human"|"gpt", "value": ...}``;
    ``"openai"``: turns ``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``. Loss goes on the
    assistant turns (and, with ``train_on_input``, on every turn).

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer (its chat format is applied).
        source (str): hub name, builder with ``data_files``, directory or file.
        conversation_column (str): the column holding each conversation's list of turns.
        conversation_style (str): ``"sharegpt"`` or ``"openai"``.
        train_on_input (bool): compute loss on non-assistant turns too. Default False.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        masking_strategy (str | None): ``"train_on_assistant"``, ``"train_on_all"`` or ``"train_on_last"``
            (only the final assistant turn); None follows ``train_on_input``.
        packed (bool): pack samples into ``tokenizer.max_seq_len`` rows. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: an :class:`SFTDataset`, or a :class:`~tune.data.PackedDataset` when ``packed``.

    Raises:
        ValueError: for an unknown style or masking strategy, a missing column, empty data, or a bad row (naming
            its index).
    """
    if conversation_style not in _STYLES:
        raise ValueError(f"conversation_style must be one of {sorted(_STYLES)}, got {conversation_style!r}.")
    transform_cls, key = _STYLES[conversation_style]
    transform = transform_cls(
        train_on_input=train_on_input,
        column_map={key: conversation_column},
        new_system_prompt=new_system_prompt,
        masking_strategy=masking_strategy,
    )
    ds = SFTDataset(
        source=source,
        message_transform=transform,
        model_transform=tokenizer,
        filter_fn=filter_fn,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
    return maybe_pack(ds, tokenizer, packed)
