from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import ModelTokenizer
from tune.datasets._instruct import instruct_dataset


def samsum_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = "Samsung/samsum",
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """SAMSum (``Samsung/samsum``): chat dialogues (column ``dialogue``, the user turn) and their summaries
    (column ``summary``, the assistant turn).

    The rows are used as they are; the summarisation prompt comes from the tokenizer's prompt template, as in
    torchtune: build the tokenizer with ``prompt_template="tune.data.SummarizeTemplate"``.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file. Default ``"Samsung/samsum"``.
        column_map (dict[str, str] | None): maps ``input``/``output`` to column names. Default
            ``{"input": "dialogue", "output": "summary"}``.
        train_on_input (bool): compute loss on the dialogue too. Default False.
        new_system_prompt (str | None): system message prepended to every sample (masked).
        packed (bool): pack samples into ``tokenizer.max_seq_len`` rows. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: an :class:`~tune.datasets.SFTDataset`, or a :class:`~tune.data.PackedDataset` when ``packed``.

    Raises:
        ValueError: see :func:`~tune.datasets.instruct_dataset`.
    """
    return instruct_dataset(
        tokenizer, source=source, column_map=column_map or {"input": "dialogue", "output": "summary"},
        train_on_input=train_on_input, new_system_prompt=new_system_prompt, packed=packed, filter_fn=filter_fn,
        split=split, num_proc=num_proc, **load_dataset_kwargs,
    )  # fmt: skip
