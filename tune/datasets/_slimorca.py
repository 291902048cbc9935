from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import ModelTokenizer, ShareGPTToMessages
from tune.datasets._packed import maybe_pack
from tune.datasets._sft import SFTDataset


def slimorca_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = "Open-Orca/SlimOrca-Dedup",
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """SlimOrca (``Open-Orca/SlimOrca-Dedup``): GPT-4 answers to FLAN tasks, as ShareGPT conversations in the
    ``conversations`` column (turns ``{"from": "system"|"human"|"gpt", "value": text}``).

    Loss goes on the assistant (``gpt``) turns; the system and user turns are masked unless ``train_on_input``.
    An empty system turn is dropped.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder (``"json"``, ...) with ``data_files``, directory or file.
            Default ``"Open-Orca/SlimOrca-Dedup"``.
        column_map (dict[str, str] | None): ``{"conversations": "my_column"}`` for another column name.
        train_on_input (bool): compute loss on the system and user turns too. Default False.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        packed (bool): pack samples into ``tokenizer.max_seq_len`` rows. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: an :class:`~tune.datasets.SFTDataset`, or a :class:`~tune.data.PackedDataset` when ``packed``.

    Raises:
        ValueError: for a missing column, empty data, a bad row (naming its index), or ``packed`` without the
            tokenizer's ``max_seq_len``.
    """
    ds = SFTDataset(
        source=source,
        message_transform=ShareGPTToMessages(
            train_on_input=train_on_input, column_map=column_map, new_system_prompt=new_system_prompt
        ),
        model_transform=tokenizer,
        filter_fn=filter_fn,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
    return maybe_pack(ds, tokenizer, packed)
