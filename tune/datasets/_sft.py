import gc
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tune.data import CROSS_ENTROPY_IGNORE_IDX, FlatSequences, ModelTokenizer
from tune.data._tokenizers._utils import FlatEncoding
from tune.datasets import _hf
from tune.utils import get_logger, log_rank_zero

_log = get_logger(name=__name__)


class _TokenizeConversations:
    """Batched map function: rows -> messages -> ``tokens``, ``labels`` (and a ``truncated`` flag).

    Picklable, so ``datasets.map`` can run it in worker processes. Returns an Arrow table built from flat arrays,
    which avoids converting every token through Python objects. Errors from a row are re-raised naming the row's
    index in the (filtered) dataset.
    """

    def __init__(self, message_transform: Callable, tokenizer: ModelTokenizer, source: str) -> None:
        self.message_transform = message_transform
        self.tokenizer, self.max_seq_len = _hf.untruncated(tokenizer)
        self.keeps_mask = getattr(tokenizer, "truncation_keeps_mask", False)
        self.source = source

    def encode(self, messages: list) -> tuple[list[int], list[bool], bool]:
        tokens, mask = self.tokenizer.tokenize_messages(messages)
        return _hf.truncate(list(tokens), list(mask), self.max_seq_len, self.tokenizer.eos_id, self.keeps_mask)

    def _row_error(self, rows: list[dict], indices: list[int]) -> ValueError:
        """Re-runs the rows one at a time to name the first bad one."""
        required = getattr(self.message_transform, "required_columns", ())
        for row, index in zip(rows, indices):
            try:
                self.encode(self.message_transform(row)["messages"])
            except (ValueError, TypeError, KeyError) as err:
                return _hf.row_error(self.source, index, row, err, required)
        return _hf.DatasetError(f"Dataset {self.source!r}: tokenising rows {indices[0]}..{indices[-1]} failed.")

    def _encode_batch(self, rows: list[dict], indices: list[int]) -> FlatEncoding:
        """Tokens and trained flags of all rows, end to end: from ``tokenize_messages_flat`` when the tokenizer has
        it, else from one ``tokenize_messages_batch`` call (or a ``tokenize_messages`` call per row)."""
        flat_tokenize = getattr(self.tokenizer, "tokenize_messages_flat", None)
        batch_tokenize = getattr(self.tokenizer, "tokenize_messages_batch", None)
        try:
            conversations = [self.message_transform(row)["messages"] for row in rows]
            if flat_tokenize is not None:
                return flat_tokenize(conversations)
            if batch_tokenize is not None:
                encoded = batch_tokenize(conversations)
            else:
                encoded = [self.tokenizer.tokenize_messages(messages) for messages in conversations]
        except (ValueError, TypeError, KeyError) as err:
            raise self._row_error(rows, indices) from err
        return FlatEncoding.join([(tokens, [not m for m in mask]) for tokens, mask in encoded])

    def __call__(self, batch: dict[str, list], indices: list[int]):
        # A batch allocates millions of small lists and ints that are freed right after; the cyclic garbage
        # collector would rescan them many times over (a third of the tokenising time), and they hold no cycles.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._tokenize(batch, indices)
        finally:
            if enabled:
                gc.enable()

    def _tokenize(self, batch: dict[str, list], indices: list[int]):
        import pyarrow as pa

        encoded = self._encode_batch(_hf.rows_of(batch), indices)
        tokens, labels, cuts = _hf.token_columns(encoded, self.max_seq_len, self.tokenizer.eos_id, self.keeps_mask)
        return pa.table({"tokens": tokens, "labels": labels, "truncated": cuts})


def _sft_features():
    from datasets import Features, Sequence, Value

    ids = Sequence(Value("int32"))
    return Features({"tokens": ids, "labels": ids, "truncated": Value("bool")})


def log_truncated(
    ds, source: str, max_seq_len: int | None, column: str = "truncated", labels_columns: Sequence[str] = ("labels",)
) -> int:
    """Logs and returns how many samples were cut to ``max_seq_len``; warns about samples left without a loss token.

    A sample whose labels (any of ``labels_columns``: both sides of a preference pair) are all ``-100`` trains
    nothing: typically a prompt longer than ``max_seq_len``, cut before its answer. The count reads the label
    columns once, in array operations.
    """
    import pyarrow.compute as pc

    table = ds.with_format("arrow")[:]
    cut = table.column(column).to_numpy(zero_copy_only=False).astype(bool)
    count = int(cut.sum())
    message = f"Dataset {source!r}: {len(ds):,} samples"
    if count:
        message += f", {count:,} truncated to max_seq_len={max_seq_len}"
    _log.info(message + ".")
    untrained = np.zeros(len(cut), dtype=bool)
    for name in labels_columns:
        first = 0
        for labels in table.column(name).chunks:  # chunk by chunk: memory bounded by a chunk's labels
            rows = pc.list_parent_indices(labels).to_numpy(zero_copy_only=False)
            trained = pc.not_equal(pc.list_flatten(labels), CROSS_ENTROPY_IGNORE_IDX).to_numpy(zero_copy_only=False)
            untrained[first : first + len(labels)] |= np.bincount(rows[trained], minlength=len(labels)) == 0
            first += len(labels)
    num_cut, num_other = int((untrained & cut).sum()), int((untrained & ~cut).sum())
    if num_cut:
        log_rank_zero(
            _log,
            f"Dataset {source!r}: {num_cut:,} of {len(cut):,} samples have no loss token after truncation to "
            f"max_seq_len={max_seq_len}; they train nothing. Raise tokenizer.max_seq_len, or set "
            "dataset.train_on_input=True to train on their prompts.",
            logging.WARNING,
        )
    if num_other:
        log_rank_zero(
            _log,
            f"Dataset {source!r}: {num_other:,} of {len(cut):,} samples have every label masked (an empty answer, "
            "or train_on_input=False with nothing but input); they train nothing.",
            logging.WARNING,
        )
    return count


class SFTDataset(Dataset):
    """A supervised fine-tuning dataset: rows -> messages -> tokens and labels, tokenised once and cached.

    Loads ``source`` with Hugging Face ``datasets``, checks the columns ``message_transform`` needs, applies
    ``filter_fn``, then tokenises every row with ``datasets.map`` (``num_proc`` processes) into ``tokens`` and
    ``labels`` (``-100`` on masked tokens), truncating to the tokenizer's ``max_seq_len`` and logging how many
    samples were cut. The result is cached on disk, keyed by the data, transform, tokenizer and settings.

    Args:
        source (str): hub name, builder (``"json"``, ``"parquet"``, ``"csv"``, ``"text"``) with
            ``data_files``, local directory or data file.
        message_transform (Callable): row -> ``{"messages": list[Message]}`` with a ``required_columns``
            attribute, e.g. :class:`~tune.data.InputOutputToMessages`.
        model_transform (ModelTokenizer): the model's tokenizer (``tokenize_messages``).
        filter_fn (Callable | None): keep a raw row when it returns True (applied before tokenising).
        split (str): which split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by dataset size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir``, ...).

    Raises:
        ValueError: for a missing column (naming expected and available ones), an empty dataset (also after
            filtering), or a bad row (naming its index).
    """

    def __init__(
        self,
        *,
        source: str,
        message_transform: Callable,
        model_transform: ModelTokenizer,
        filter_fn: Callable | None = None,
        split: str = "train",
        num_proc: int | None = None,
        **load_dataset_kwargs: Any,
    ) -> None:
        raw = _hf.load_source(source, split=split, **load_dataset_kwargs)
        source = _hf.describe_source(source, load_dataset_kwargs)  # for messages and logs
        _hf.check_columns(raw, getattr(message_transform, "required_columns", []), source)
        procs = _hf.resolve_num_proc(num_proc, len(raw))
        raw = _hf.filter_rows(raw, filter_fn, source, procs)
        source += " (after filter_fn; row numbers count kept rows)" if filter_fn is not None else ""
        function = _TokenizeConversations(message_transform, model_transform, source)
        key = _hf.fingerprint(
            raw, "sft", _hf.code_identity(message_transform), message_transform, _hf.code_identity(function),
            _hf.tokenizer_identity(model_transform), str(function.max_seq_len),
        )  # fmt: skip
        data = _hf.tokenize_rows(
            raw, function, features=_sft_features(), num_proc=procs, new_fingerprint=key, desc="Tokenizing"
        )
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
