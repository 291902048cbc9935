from collections.abc import Callable
from functools import partial
from typing import Any

from torch.utils.data import Dataset

from tune.data import AlpacaToMessages, ModelTokenizer
from tune.datasets._packed import maybe_pack
from tune.datasets._sft import SFTDataset


def alpaca_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = "tatsu-lab/alpaca",
    column_map: dict[str, str] | None = None,
    train_on_input: bool = True,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Alpaca-format data (``instruction``, optional ``input``, ``output``) with the Alpaca prompt.

    The user turn is the Alpaca prompt (:func:`~tune.data.alpaca_prompt`, with or without the input section),
    the assistant turn is ``output``.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name or local data. Default ``"tatsu-lab/alpaca"``; e.g. ``source="json",
            data_files="my_alpaca.json"`` for a local file.
        column_map (dict[str, str] | None): maps ``instruction``/``input``/``output`` to your column names.
        train_on_input (bool): compute loss on the prompt too. Default True, as in the Alpaca recipe.
        packed (bool): pack samples into ``tokenizer.max_seq_len`` rows. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: an :class:`SFTDataset`, or a :class:`~tune.data.PackedDataset` when ``packed``.

    Raises:
        ValueError: for missing columns, empty data, a bad row, or ``packed`` without ``max_seq_len``.
    """
    ds = SFTDataset(
        source=source,
        message_transform=AlpacaToMessages(train_on_input=train_on_input, column_map=column_map),
        model_transform=tokenizer,
        filter_fn=filter_fn,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
    return maybe_pack(ds, tokenizer, packed)


alpaca_cleaned_dataset = partial(alpaca_dataset, source="yahma/alpaca-cleaned")
alpaca_cleaned_dataset.__doc__ = """Builds :func:`alpaca_dataset` from ``yahma/alpaca-cleaned`` (Alpaca with fixes).

Takes the same arguments as :func:`alpaca_dataset`.
"""
