"""Dataset builders over Hugging Face ``datasets``: instruct, alpaca, chat, text completion, preference, mixing.

Every builder takes the model's tokenizer as its first argument, loads ``source`` with ``datasets.load_dataset``
(hub name, ``"json"``/``"parquet"``/``"csv"``/``"text"`` with ``data_files``, a local directory or file),
tokenises once with ``datasets.map`` (cached on disk) and, with ``packed=True``, returns a
:class:`~tune.data.PackedDataset`.
"""

from tune.data import PackedDataset
from tune.datasets._alpaca import alpaca_cleaned_dataset, alpaca_dataset
from tune.datasets._chat import chat_dataset
from tune.datasets._concat import ConcatDataset
from tune.datasets._instruct import instruct_dataset
from tune.datasets._preference import PreferenceDataset, preference_dataset
from tune.datasets._sft import SFTDataset
from tune.datasets._text_completion import TextCompletionDataset, text_completion_dataset
from tune.datasets._weighted import WeightedDataset

__all__ = [
    "ConcatDataset",
    "PackedDataset",
    "PreferenceDataset",
    "SFTDataset",
    "TextCompletionDataset",
    "WeightedDataset",
    "alpaca_cleaned_dataset",
    "alpaca_dataset",
    "chat_dataset",
    "instruct_dataset",
    "preference_dataset",
    "text_completion_dataset",
]
