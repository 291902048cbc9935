from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from tune.data import FlatSequences, ModelTokenizer
from tune.datasets import _hf
from tune.datasets._packed import maybe_pack
from tune.datasets._sft import log_truncated
from tune.utils import get_logger

_log = get_logger(name=__name__)


class _TokenizeText:
    """Batched map function: ``column`` text -> tokens (labels equal tokens). Empty texts are dropped."""

    def __init__(
        self, tokenizer: ModelTokenizer, column: str, add_eos: bool, source: str, max_seq_len: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        limits = [n for n in (getattr(tokenizer, "max_seq_len", None), max_seq_len) if n is not None]
        self.max_seq_len = min(limits) if limits else None
        self.column, self.add_eos, self.source = column, add_eos, source

    def __call__(self, batch: dict[str, list], indices: list[int]):
        import pyarrow as pa

        tokens, cuts = [], []
        for text, index in zip(batch[self.column], indices):
            if not isinstance(text, str):
                got = "nothing (the column is missing or null in this row)" if text is None else type(text).__name__
                raise _hf.DatasetError(
                    f"Dataset {self.source!r}, row {index}: column {self.column!r} must hold a string, got {got}."
                )
            if not text.strip():
                continue  # blank lines of a text corpus carry nothing to learn; counted in the log
            ids = self.tokenizer.encode(text, add_bos=True, add_eos=self.add_eos)
            cut = self.max_seq_len is not None and len(ids) > self.max_seq_len
            # keep the start of the text; a cut text does not end there, so no EOS is forced in
            tokens.append(ids[: self.max_seq_len] if cut else ids)
            cuts.append(cut)
        column = _hf.list_column(tokens)
        return pa.table({"tokens": column, "labels": column, "truncated": pa.array(cuts, pa.bool_())})


class TextCompletionDataset(Dataset):
    """Unstructured text for continued pre-training: each row's text becomes one sample, loss on every token.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer (``encode``; ``max_seq_len`` truncates).
        source (str): hub name, builder (e.g. ``"text"``) with ``data_files``, directory or file.
        column (str): column holding the text. Default ``"text"``.
        add_eos (bool): append EOS to every text. Default True.
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        max_seq_len (int | None): cut texts to this many tokens (the tokenizer's ``max_seq_len`` cuts too; the
            smaller applies). Default None.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Raises:
        ValueError: for a missing column, empty data (also after filtering or dropping blank texts), or a
            non-string text (naming the row index).
    """

    def __init__(
        self,
        tokenizer: ModelTokenizer,
        source: str,
        column: str = "text",
        add_eos: bool = True,
        filter_fn: Callable | None = None,
        split: str = "train",
        num_proc: int | None = None,
        max_seq_len: int | None = None,
        **load_dataset_kwargs: Any,
    ) -> None:
        from tune.datasets._sft import _sft_features

        raw = _hf.load_source(source, split=split, **load_dataset_kwargs)
        source = _hf.describe_source(source, load_dataset_kwargs)  # for messages and logs
        _hf.check_columns(raw, [column], source, hint="the `column` argument")
        procs = _hf.resolve_num_proc(num_proc, len(raw))
        raw = _hf.filter_rows(raw, filter_fn, source, procs)
        source += " (after filter_fn; row numbers count kept rows)" if filter_fn is not None else ""
        function = _TokenizeText(tokenizer, column, add_eos, source, max_seq_len)
        key = _hf.fingerprint(
            raw,
            "text",
            column,
            str(add_eos),
            _hf.code_identity(function),
            _hf.tokenizer_identity(tokenizer),
            str(function.max_seq_len),
        )
        data = _hf.tokenize_rows(
            raw, function, features=_sft_features(), num_proc=procs, new_fingerprint=key, desc="Tokenizing"
        )
        if len(data) == 0:
            raise ValueError(f"Every row of dataset {source!r} has an empty {column!r}; nothing is left to train on.")
        if len(data) < len(raw):
            _log.info(f"Dataset {source!r}: dropped {len(raw) - len(data):,} rows with blank {column!r}.")
        self.max_seq_len = function.max_seq_len
        self.num_truncated = log_truncated(data, source, self.max_seq_len)
        self._data = data.select_columns(["tokens", "labels"])

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self._data[index]

    def as_flat_sequences(self) -> FlatSequences:
        """All samples as flat token/label arrays (used by :class:`~tune.data.PackedDataset`)."""
        return _hf.flat_sequences(self._data)


def text_completion_dataset(
    tokenizer: ModelTokenizer,
    source: str,
    column: str = "text",
    add_eos: bool = True,
    packed: bool = False,
    split_across_pack: bool = True,
    split: str = "train",
    filter_fn: Callable | None = None,
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Builds a :class:`TextCompletionDataset`, optionally packed.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder (e.g. ``"text"``) with ``data_files``, directory or file.
        column (str): column holding the text. Default ``"text"``.
        add_eos (bool): append EOS to every text. Default True.
        packed (bool): pack into ``tokenizer.max_seq_len`` rows. Default False.
        split_across_pack (bool): when packing, let a text continue in the next pack instead of moving it
            whole. Default True (nothing of a long text is lost).
        split (str): split to load. Default ``"train"``.
        filter_fn (Callable | None): keep a raw row when it returns True.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        Dataset: a :class:`TextCompletionDataset` or a :class:`~tune.data.PackedDataset`.

    Raises:
        ValueError: see :class:`TextCompletionDataset`; also ``packed`` without ``max_seq_len``.
    """
    ds = TextCompletionDataset(
        tokenizer, source, column=column, add_eos=add_eos, filter_fn=filter_fn, split=split, num_proc=num_proc,
        **load_dataset_kwargs,
    )  # fmt: skip
    return maybe_pack(ds, tokenizer, packed, split_across_pack=split_across_pack)
