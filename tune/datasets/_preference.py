from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import ChosenRejectedToMessages, ModelTokenizer
from tune.datasets import _hf
from tune.datasets._sft import _TokenizeConversations, log_truncated

_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


class _TokenizePairs(_TokenizeConversations):
    """Batched map function: a row's chosen and rejected conversations -> tokens and labels of each (and the
    row's ``margin_column`` value as ``margin``, when set)."""

    margin_column: str | None = None

    def __call__(self, batch: dict[str, list], indices: list[int]):
        import pyarrow as pa

        encoded: dict[str, list] = {"chosen": [], "rejected": []}
        cuts, margins = [], []
        for row, index in zip(_hf.rows_of(batch), indices):
            try:
                pair = self.message_transform(row)
                chosen, rejected = self.encode(pair["chosen"]), self.encode(pair["rejected"])
                if self.margin_column is not None:
                    margins.append(float(row[self.margin_column]))
            except (ValueError, TypeError, KeyError) as err:
                required = getattr(self.message_transform, "required_columns", ())
                raise _hf.row_error(self.source, index, row, err, required) from err
            encoded["chosen"].append(chosen)
            encoded["rejected"].append(rejected)
            cuts.append(chosen[2] or rejected[2])
        columns = {}
        for prefix, samples in encoded.items():
            tokens, masks = [s[0] for s in samples], [s[1] for s in samples]
            columns[f"{prefix}_input_ids"] = _hf.list_column(tokens)
            columns[f"{prefix}_labels"] = _hf.list_column(tokens, masks)
        if self.margin_column is not None:
            columns["margin"] = pa.array(margins, pa.float64())
        return pa.table({**columns, "truncated": pa.array(cuts, pa.bool_())})


class PreferenceDataset(Dataset):
    """Preference pairs for DPO-style training, tokenised once and cached like :class:`SFTDataset`.

    Each item has ``chosen_input_ids``, ``chosen_labels``, ``rejected_input_ids``, ``rejected_labels``
    (labels ``-100`` on masked tokens), and ``margin`` with ``margin_column``; batch them with
    :func:`~tune.data.padded_collate_dpo`.

    Args:
        source (str): hub name, builder with ``data_files``, directory or file.
        message_transform (Callable): row -> ``{"chosen": [...], "rejected": [...]}`` with ``required_columns``.
        tokenizer (ModelTokenizer): the model's tokenizer.
        filter_fn (Callable | None): keep a raw row when it returns True.
        packed (bool): packing preference pairs is not supported; must be False (torchtune's argument).
        margin_column (str | None): a numeric column carried as each pair's ``margin`` (how much the chosen
            response should win by: ``tune.rlhf.loss.RewardModelLoss``); None for none. Default None.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Raises:
        ValueError: for ``packed=True``, a missing column, empty data, or a bad row (naming its index).
    """

    def __init__(
        self,
        *,
        source: str,
        message_transform: Callable,
        tokenizer: ModelTokenizer,
        filter_fn: Callable | None = None,
        packed: bool = False,
        margin_column: str | None = None,
        split: str = "train",
        num_proc: int | None = None,
        **load_dataset_kwargs: Any,
    ) -> None:
        from datasets import Features, Sequence, Value

        if packed:
            raise ValueError(
                "packed=True is not supported for preference datasets (a chosen and a rejected sequence form one "
                "sample); leave packed as False."
            )

        raw = _hf.load_source(source, split=split, **load_dataset_kwargs)
        source = _hf.describe_source(source, load_dataset_kwargs)  # for messages and logs
        required = [*getattr(message_transform, "required_columns", []), *([margin_column] if margin_column else [])]
        _hf.check_columns(raw, required, source)
        procs = _hf.resolve_num_proc(num_proc, len(raw))
        raw = _hf.filter_rows(raw, filter_fn, source, procs)
        source += " (after filter_fn; row numbers count kept rows)" if filter_fn is not None else ""
        function = _TokenizePairs(message_transform, tokenizer, source)
        function.margin_column = margin_column
        columns = [*_COLUMNS, "margin"] if margin_column else list(_COLUMNS)
        key = _hf.fingerprint(
            raw, "preference", _hf.code_identity(message_transform), message_transform, _hf.code_identity(function),
            _hf.tokenizer_identity(tokenizer), str(function.max_seq_len), str(margin_column),
        )  # fmt: skip
        features = {**{c: Sequence(Value("int32")) for c in _COLUMNS}, "truncated": Value("bool")}
        if margin_column:
            features["margin"] = Value("float64")
        features = Features(features)
        data = _hf.tokenize_rows(
            raw, function, features=features, num_proc=procs, new_fingerprint=key, desc="Tokenizing"
        )
        self.num_truncated = log_truncated(
            data, source, function.max_seq_len, labels_columns=("chosen_labels", "rejected_labels")
        )
        self._data = data.select_columns(columns)

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self._data[index]


def preference_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    column_map: dict[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    filter_fn: Callable | None = None,
    margin_column: str | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> PreferenceDataset:
    """Preference data with ``chosen`` and ``rejected`` columns, each a list of OpenAI-style messages.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
        column_map (dict[str, str] | None): maps ``chosen``/``rejected`` to your column names.
        train_on_input (bool): compute loss on the prompt turns too. Default False.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        filter_fn (Callable | None): keep a raw row when it returns True.
        margin_column (str | None): a numeric column carried as each pair's ``margin`` (reward-model training
            with a margin). Default None.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        PreferenceDataset: the tokenised pairs.

    Raises:
        ValueError: see :class:`PreferenceDataset`.
    """
    return PreferenceDataset(
        source=source,
        message_transform=ChosenRejectedToMessages(
            train_on_input=train_on_input, column_map=column_map, new_system_prompt=new_system_prompt
        ),
        tokenizer=tokenizer,
        filter_fn=filter_fn,
        margin_column=margin_column,
        split=split,
        num_proc=num_proc,
        **load_dataset_kwargs,
    )
