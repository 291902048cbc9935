from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import InputOutputToMessages, ModelTokenizer
from tune.datasets._packed import maybe_pack
from tune.datasets._sft import SFTDataset


def instruct_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    packed: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Instruction data with one prompt column (``input``) and one response column (``output``).

    Example: ``instruct_dataset(tok, source="json", data_files="qa.json", column_map={"input": "question",
    "output": "answer"})``.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder (``"json"``, ``"csv"``, ...) with ``data_files``, directory or file.
        column_map (dict[str, str] | None): maps ``input``/``output`` to your column names.
        train_on_input (bool): compute loss on the prompt too. Default False.
        new_system_prompt (str | None): system message prepended to every sample (masked).
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
        message_transform=InputOutputToMessages(
            train_on_input=train_on_input, column_map=column_map, new_system_prompt=new_system_prompt
        ),
        model_transform=tokenizer,
        filter_fn=filter_fn,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
    return maybe_pack(ds, tokenizer, packed)
