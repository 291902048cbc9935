from collections.abc import Callable, Mapping
from typing import Any

from tune.data import Message, ModelTokenizer
from tune.datasets._preference import PreferenceDataset

_DEFAULT_SOURCE = "lvwerra/stack-exchange-paired"


class _StackExchangePairedToMessages:
    """A question with a preferred and a rejected answer -> ``{"chosen": [user, assistant], "rejected": [...]}``.

    Args:
        train_on_input (bool): compute loss on the question too.
        column_map (Mapping[str, str]): the columns holding ``prompt``, ``chosen`` and ``rejected``.
    """

    def __init__(self, train_on_input: bool, column_map: Mapping[str, str]) -> None:
        unknown = sorted(set(column_map) - {"prompt", "chosen", "rejected"})
        if unknown:
            raise ValueError(
                f"stack_exchange_paired_dataset: column_map has unknown key(s) {unknown}; the keys it accepts are "
                "'prompt', 'chosen' and 'rejected'."
            )
        self.train_on_input = train_on_input
        self.column_map = {key: column_map.get(key, key) for key in ("prompt", "chosen", "rejected")}

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        question = row[self.column_map["prompt"]]
        out = {}
        for key in ("chosen", "rejected"):
            out[key] = [
                Message("user", question, masked=not self.train_on_input),
                Message("assistant", row[self.column_map[key]]),
            ]
        return out


def stack_exchange_paired_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str = _DEFAULT_SOURCE,
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> PreferenceDataset:
    """Stack Exchange questions with a preferred and a rejected answer (``lvwerra/stack-exchange-paired``,
    columns ``question``, ``response_j`` (chosen) and ``response_k`` (rejected)), for DPO-style training.

    Each pair is ``[user: question, assistant: answer]``; loss goes on the answer. From the default source the
    ``data/rl`` files are read, as torchtune does.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
            Default ``"lvwerra/stack-exchange-paired"``.
        column_map (dict[str, str] | None): maps ``prompt``/``chosen``/``rejected`` to column names. Default
            ``{"prompt": "question", "chosen": "response_j", "rejected": "response_k"}``.
        train_on_input (bool): compute loss on the question too. Default False.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        PreferenceDataset: the tokenised pairs.

    Raises:
        ValueError: for an unknown column_map key; see also :class:`~tune.datasets.PreferenceDataset`.
    """
    column_map = column_map or {"prompt": "question", "chosen": "response_j", "rejected": "response_k"}
    if source == _DEFAULT_SOURCE:
        load_dataset_kwargs.setdefault("data_dir", "data/rl")
    return PreferenceDataset(
        source=source,
        message_transform=_StackExchangePairedToMessages(train_on_input, column_map),
        tokenizer=tokenizer,
        filter_fn=filter_fn,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
