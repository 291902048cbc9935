"""Shared plumbing of the dataset builders: loading a source, checking columns, filtering, cached tokenisation.

Tokenisation runs once through ``datasets.Dataset.map`` (several processes for large data) and its result is
stored in Hugging Face datasets' on-disk cache under a fingerprint we compute from what determines the output:
the loaded data's own fingerprint (file contents for local files), the row transform and its settings, the
tokenizer's identity and ``max_seq_len``, and the version of this code. A second run with the same inputs loads
the cached Arrow file instead of tokenising again; change any of them and it tokenises afresh.
"""

import copy
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tune.data import CROSS_ENTROPY_IGNORE_IDX, FlatSequences, ModelTokenizer
from tune.utils import get_logger, get_world_size

_log = get_logger(__name__)

# Bump when the tokenisation output of this module changes, so old cache entries are not reused.
_PIPELINE_VERSION = "2"
# Below this many rows one process is faster than starting workers.
_MIN_ROWS_PER_PROC = 10_000

_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text", ".arrow": "arrow",
}  # fmt: skip


def load_source(source: str, *, split: str, **load_dataset_kwargs: Any):
    """Loads one split of a dataset with ``datasets.load_dataset`` (or ``load_from_disk`` for a saved dataset).

    ``source`` may be a Hugging Face hub name, a builder name (``"json"``, ``"parquet"``, ``"csv"``, ``"text"``)
    with ``data_files=...``, a local directory, or the path of one data file.

    Raises:
        ValueError: when the source cannot be loaded, ``streaming`` is requested, or the split is missing.
    """
    import datasets

    if load_dataset_kwargs.get("streaming"):
        raise ValueError("streaming=True is not supported: packing and caching need the whole split on disk.")
    suffix = os.path.splitext(source)[1].lower()
    if os.path.isfile(source) and suffix in _FILE_BUILDERS and "data_files" not in load_dataset_kwargs:
        load_dataset_kwargs["data_files"] = source
        source = _FILE_BUILDERS[suffix]
    try:
        if os.path.isdir(source) and os.path.isfile(os.path.join(source, "state.json")):
            loaded = datasets.load_from_disk(source)  # a dataset saved with save_to_disk
            loaded = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            loaded = datasets.load_dataset(source, split=split, **load_dataset_kwargs)
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        raise ValueError(
            f"Could not load dataset source {source!r} (split={split!r}, {load_dataset_kwargs}): {err}. Use a hub "
            f"name, a local directory or file, or a builder such as 'json' with data_files='path/to/file.json'."
        ) from err
    except KeyError as err:
        raise ValueError(f"Dataset source {source!r} has no split {split!r}: {err}") from err
    if not isinstance(loaded, datasets.Dataset):
        raise ValueError(f"Dataset source {source!r} gave a {type(loaded).__name__}; pass split='train' (or another).")
    return loaded


def describe_source(source: str, load_dataset_kwargs: dict) -> str:
    """``source`` plus its ``data_files`` when given (``"json"`` alone does not say which file)."""
    data_files = load_dataset_kwargs.get("data_files")
    return f"{source}:{data_files}" if data_files else source


def check_columns(ds, required: Sequence[str], source: str, hint: str = "column_map") -> None:
    """Raises a ValueError naming the expected and the available columns when any required one is missing."""
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"Dataset {source!r} has no column(s) {missing}. Expected columns: {list(required)}; available: "
            f"{ds.column_names}. Rename them in the data or map them with {hint}."
        )


def resolve_num_proc(num_proc: int | None, num_rows: int) -> int:
    """``None`` picks one process for small data and, for large data, up to 8 (the CPUs per rank)."""
    if num_proc is not None:
        if num_proc < 1:
            raise ValueError(f"num_proc must be >= 1 or None (automatic), got {num_proc}.")
        return num_proc
    if num_rows < 2 * _MIN_ROWS_PER_PROC:
        return 1
    # every rank of a distributed run builds its dataset at the same time: share the CPUs between them
    cpus = max(1, (os.cpu_count() or 1) // max(1, get_world_size()))
    return max(1, min(cpus, 8, num_rows // _MIN_ROWS_PER_PROC))


def filter_rows(ds, filter_fn: Callable | None, source: str, num_proc: int):
    """Applies ``filter_fn`` to the raw rows; an empty result is an error rather than a zero-step run."""
    if len(ds) == 0:
        raise ValueError(f"Dataset {source!r} is empty: check source, data_files and split.")
    if filter_fn is None:
        return ds
    kept = ds.filter(filter_fn, num_proc=num_proc if num_proc > 1 else None, desc="Filtering")
    if len(kept) == 0:
        raise ValueError(f"filter_fn removed all {len(ds):,} rows of dataset {source!r}; nothing is left to train on.")
    _log.info(f"filter_fn kept {len(kept):,} of {len(ds):,} rows of {source!r}.")
    return kept


def _stable_hash(obj: Any) -> str | None:
    from datasets.fingerprint import Hasher

    try:
        return Hasher.hash(obj)
    except Exception:  # an object that cannot be pickled has no stable identity
        return None


def tokenizer_identity(tokenizer: Any) -> str:
    """A string that changes when the tokenizer would produce different tokens.

    The tokenizer's whole pickled state is hashed when it can be pickled (vocabulary, special tokens,
    templates); otherwise its class, special ids and the output on a fixed probe conversation are used.
    """
    state = _stable_hash(tokenizer)
    if state is not None:
        return f"{type(tokenizer).__qualname__}:{state}:{_code_hash(tokenizer)}"
    from tune.data import Message

    probe = [
        Message(role="system", content="Probe: system.", masked=True),
        Message(role="user", content="Probe user turn, with digits 0123 and ünïcödé.", masked=True),
        Message(role="assistant", content="Probe answer.\n\tEnd.", masked=False),
    ]
    summary = (
        type(tokenizer).__module__, type(tokenizer).__qualname__, tokenizer.bos_id, tokenizer.eos_id,
        tokenizer.pad_id, getattr(tokenizer, "max_seq_len", None), tokenizer.tokenize_messages(probe),
        tokenizer.encode("Probe text.", add_bos=True, add_eos=True),
    )  # fmt: skip
    _log.warning(
        f"Tokenizer {type(tokenizer).__name__} cannot be pickled; its cache key uses a probe of its output, "
        f"so delete the datasets cache after changing its vocabulary in place."
    )
    return hashlib.sha256(repr(summary).encode()).hexdigest()


def code_identity(obj: Any) -> str:
    """The source code of ``obj``'s class (so editing a transform invalidates its cached output), or its name."""
    import inspect

    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return f"{cls.__module__}.{cls.__qualname__}:{inspect.getsource(cls)}"
    except (OSError, TypeError):  # defined interactively: no source to read
        return f"{cls.__module__}.{cls.__qualname__}"


def _code_hash(tokenizer: Any) -> str:
    """Source of the tokenizer's class and of its components' classes from the same package (chat format, text
    tokenizer), so a library upgrade that changes how tokens are produced does not reuse old cache entries."""
    package = type(tokenizer).__module__.split(".")[0]
    classes = {type(tokenizer)}
    classes.update(type(value) for value in vars(tokenizer).values() if type(value).__module__.split(".")[0] == package)
    sources = sorted(code_identity(cls) for cls in classes)
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]


def fingerprint(ds, *parts: Any) -> str | None:
    """Fingerprint of a map over ``ds`` determined by ``parts``; None when ``ds`` has none (no caching then)."""
    base = getattr(ds, "_fingerprint", None)
    if base is None:
        return None
    digest = hashlib.sha256(f"tune-data-v{_PIPELINE_VERSION}|{base}".encode())
    for part in parts:
        digest.update(b"|")
        digest.update((part if isinstance(part, str) else (_stable_hash(part) or os.urandom(16).hex())).encode())
    return digest.hexdigest()[:32]


def untruncated(tokenizer: ModelTokenizer) -> tuple[ModelTokenizer, int | None]:
    """Returns a shallow copy of the tokenizer with ``max_seq_len=None`` and the original ``max_seq_len``.

    The datasets truncate themselves, so that they can count how many samples were cut.
    """
    max_seq_len = getattr(tokenizer, "max_seq_len", None)
    if max_seq_len is None:
        return tokenizer, None
    clone = copy.copy(tokenizer)
    clone.max_seq_len = None
    return clone, max_seq_len


def truncate(
    tokens: list[int], mask: list[bool], max_seq_len: int | None, eos_id: int
) -> tuple[list[int], list[bool], bool]:
    """Cuts a sample to ``max_seq_len`` tokens; returns ``(tokens, mask, was_truncated)``.

    As the tokenizers' own truncation (:func:`tune.data.truncate`) does: a sample that ended with EOS still ends
    with EOS, and that forced EOS gets no loss (the text did not really end there).
    """
    if max_seq_len is None or len(tokens) <= max_seq_len:
        return tokens, mask, False
    ends_with_eos = tokens[-1] == eos_id
    tokens, mask = tokens[:max_seq_len], mask[:max_seq_len]
    if ends_with_eos:
        tokens[-1], mask[-1] = eos_id, True
    return tokens, mask, True


def tokenize_rows(raw, function: Callable, *, features, num_proc: int, new_fingerprint: str | None, desc: str):
    """Runs the batched tokenising ``function(batch, indices)`` over ``raw``, cached on disk when possible."""
    return raw.map(
        function,
        batched=True,
        batch_size=1000,
        with_indices=True,
        remove_columns=raw.column_names,
        features=features,
        num_proc=num_proc if num_proc > 1 else None,
        new_fingerprint=new_fingerprint,
        desc=desc,
    )


def list_column(sequences: list[list[int]], mask: list[list[bool]] | None = None):
    """A pyarrow ``list<int32>`` column, converted by pyarrow in one call (no per-element Python work).

    With ``mask`` (True = no loss) the values are labels: the sequence's ids where the mask is False, else -100.
    """
    import pyarrow as pa

    column = pa.array(sequences, type=pa.list_(pa.int32()))
    if mask is None:
        return column
    flags = pa.array(mask, type=pa.list_(pa.bool_())).values.to_numpy(zero_copy_only=False)
    labels = np.where(flags, np.int32(CROSS_ENTROPY_IGNORE_IDX), column.values.to_numpy())
    return pa.ListArray.from_arrays(column.offsets, pa.array(labels))


def rows_of(batch: dict[str, list]) -> list[dict[str, Any]]:
    """Columns of a batch -> list of row dicts."""
    names = list(batch)
    return [dict(zip(names, values)) for values in zip(*(batch[n] for n in names))]


def flat_sequences(ds, tokens_column: str = "tokens", labels_column: str = "labels") -> FlatSequences:
    """Reads two list columns of a tokenised dataset into flat int32 arrays without per-row Python work."""
    import pyarrow.compute as pc

    table = ds.with_format("arrow")[:]
    tokens_col, labels_col = table.column(tokens_column), table.column(labels_column)
    lengths = pc.list_value_length(tokens_col).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])

    def flat(col) -> np.ndarray:
        parts = [pc.list_flatten(chunk).to_numpy(zero_copy_only=False) for chunk in col.chunks]
        return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)

    return FlatSequences(tokens=flat(tokens_col), labels=flat(labels_col), offsets=offsets)
