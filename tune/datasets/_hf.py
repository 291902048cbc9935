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
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tune.data import CROSS_ENTROPY_IGNORE_IDX, FlatSequences, ModelTokenizer
from tune.utils import TuneError, get_logger, get_world_size

_log = get_logger(name=__name__)

# Bump when the tokenisation output of this module changes, so old cache entries are not reused.
_PIPELINE_VERSION = "3"
# Below this many rows one process is faster than starting workers.
_MIN_ROWS_PER_PROC = 10_000
# Local JSON files up to this size are loaded by tune itself (see _load_local_json); larger ones by datasets.
_FAST_JSON_MAX_BYTES = 256 * 2**20

_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text", ".arrow": "arrow",
}  # fmt: skip


class DatasetError(TuneError, ValueError):
    """A dataset that cannot be used: a source or file that does not load, a missing column, a row that does not
    fit the dataset. The message names the source or file and, where known, the line or row."""


def load_source(source: str, *, split: str, **load_dataset_kwargs: Any):
    """Loads one split of a dataset with ``datasets.load_dataset`` (or ``load_from_disk`` for a saved dataset).

    ``source`` may be a Hugging Face hub name, a builder name (``"json"``, ``"parquet"``, ``"csv"``, ``"text"``)
    with ``data_files=...``, a local directory, or the path of one data file.

    Raises:
        DatasetError: when the source cannot be loaded (a local file that does not parse is named, with the line
            where the parser tells it), ``streaming`` is requested, or the split is missing.
    """
    import datasets

    if load_dataset_kwargs.get("streaming"):
        raise ValueError("streaming=True is not supported: packing and caching need the whole split on disk.")
    suffix = os.path.splitext(source)[1].lower()
    if os.path.isfile(source) and suffix in _FILE_BUILDERS and "data_files" not in load_dataset_kwargs:
        load_dataset_kwargs["data_files"] = source
        source = _FILE_BUILDERS[suffix]
    if source == "json" and set(load_dataset_kwargs) <= {"data_files", "cache_dir"}:
        loaded = _load_local_json(load_dataset_kwargs.get("data_files"), split, load_dataset_kwargs.get("cache_dir"))
        if loaded is not None:
            return loaded
    try:
        if os.path.isdir(source) and os.path.isfile(os.path.join(source, "state.json")):
            loaded = datasets.load_from_disk(source)  # a dataset saved with save_to_disk
            loaded = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            loaded = datasets.load_dataset(source, split=split, **load_dataset_kwargs)
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        raise DatasetError(
            f"Could not load dataset source {source!r} (split={split!r}, {load_dataset_kwargs}): {err}. Use a hub "
            f"name, a local directory or file, or a builder such as 'json' with data_files='path/to/file.json'."
        ) from err
    except KeyError as err:
        raise DatasetError(f"Dataset source {source!r} has no split {split!r}: {err}") from err
    except Exception as err:
        files = _local_files(load_dataset_kwargs.get("data_files"))
        if not files:
            raise  # a hub or script source: its own error says more than we could
        raise _unreadable_files_error(source, files, err) from err
    if not isinstance(loaded, datasets.Dataset):
        raise DatasetError(
            f"Dataset source {source!r} gave a {type(loaded).__name__}; pass split='train' (or another)."
        )
    return loaded


def _json_rows(data: bytes) -> list | None:
    """The rows of a JSON array or JSON Lines file, or None when it is neither (or not UTF-8)."""
    import json

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    try:
        rows = json.loads(text)
        return rows if isinstance(rows, list) else None
    except json.JSONDecodeError:
        pass
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        return None


_DATE_LIKE = re.compile(r"\d{4}-\d\d-\d\d")


def _has_date_like_text(value: Any) -> bool:
    """Whether ``value`` (a row) holds a string that starts like a date, which pyarrow's JSON reader (and so
    datasets) may read as a timestamp: such files are left to datasets, so that columns keep datasets' types."""
    if isinstance(value, str):
        return _DATE_LIKE.match(value) is not None
    if isinstance(value, dict):
        return any(_has_date_like_text(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_date_like_text(v) for v in value[:8])
    return False


def _load_local_json(data_files: Any, split: str, cache_dir: str | None):
    """Loads local JSON / JSON Lines files of objects the way ``load_dataset("json", ...)`` does, only faster.

    ``datasets``' JSON builder turns a JSON array into JSON Lines text and parses that again, and prepares a
    builder and its cache directory, which for Alpaca-sized files costs more than the tokenising after it. Here
    the files are parsed once with ``json`` into a table (columns: every key of any row, in first-seen order;
    missing keys are null) and written once into the datasets cache as an Arrow file named by a hash of the files'
    bytes, which ``Dataset.from_file`` maps; what follows (fingerprints, the cached tokenisation next to it) works
    as for any cached dataset. Returns None, and the caller uses ``load_dataset``, for anything else: remote or
    large files, files that do not parse (its error names the line), rows that are not objects or whose values
    pyarrow cannot put in one column type, a first row with date-like text (which datasets may type as a
    timestamp), a split other than ``"train"`` or a slice of it.
    """
    import datasets
    import pyarrow as pa

    if isinstance(data_files, dict):  # {split: files}
        if set(data_files) != {split}:
            return None
        data_files = data_files[split]
    elif split != "train":  # files without a split name are datasets' "train" split (and "train[:10%]" a slice of it)
        return None
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else data_files
    if not isinstance(files, (list, tuple)) or not files or len(_local_files(files)) != len(files):
        return None
    files = [str(f) for f in files]
    if any(os.path.splitext(f)[1].lower() not in (".json", ".jsonl") for f in files):
        return None
    if sum(os.path.getsize(f) for f in files) > _FAST_JSON_MAX_BYTES:
        return None
    contents = []
    digest = hashlib.sha256(f"tune-json-v{_PIPELINE_VERSION}|{len(files)}".encode())
    for file in files:
        with open(file, "rb") as f:
            contents.append(f.read())
        digest.update(hashlib.sha256(contents[-1]).digest())
    directory = os.path.join(os.path.expanduser(cache_dir or datasets.config.HF_DATASETS_CACHE), "tune_json")
    path = os.path.join(directory, f"{digest.hexdigest()[:32]}.arrow")
    if not os.path.isfile(path):
        rows: list = []
        for data in contents:
            parsed = _json_rows(data)
            if parsed is None or not all(type(row) is dict for row in parsed):
                return None
            rows.extend(parsed)
        if not rows or _has_date_like_text(rows[0]):
            return None
        columns = list(dict.fromkeys(key for row in rows for key in row))
        try:
            table = pa.table({name: [row.get(name) for row in rows] for name in columns})
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            return None  # mixed value types: datasets' builder decides (and says) what to do
        os.makedirs(directory, exist_ok=True)
        temp = f"{path}.{os.getpid()}.tmp"
        with pa.OSFile(temp, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(temp, path)  # atomic: ranks building the same dataset at once each see a whole file
    return datasets.Dataset.from_file(path, split=split)


def _local_files(data_files: Any) -> list[str]:
    # data_files is a path, a list of paths or {split: path(s)}; only files that exist locally are named
    if isinstance(data_files, (str, os.PathLike)):
        data_files = [data_files]
    elif isinstance(data_files, dict):
        data_files = [f for v in data_files.values() for f in ([v] if isinstance(v, (str, os.PathLike)) else v)]
    elif not isinstance(data_files, (list, tuple)):
        return []
    return [str(f) for f in data_files if os.path.isfile(f)]


def _root_cause(err: BaseException) -> BaseException:
    # datasets wraps a parser's error in DatasetGenerationError("An error occurred ..."): the innermost one says what
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    return err


def _json_problem(path: str) -> str | None:
    """Where a JSON or JSON Lines file stops parsing (``line N: ...``), or None when it parses."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        return f"not UTF-8 text (byte {err.start})"
    try:
        json.loads(text)
        return None
    except json.JSONDecodeError as whole:
        if text.lstrip().startswith("["):
            return f"line {whole.lineno}, column {whole.colno}: {whole.msg}"
    for number, line in enumerate(text.splitlines(), start=1):  # JSON Lines: one object per line
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as err:
                return f"line {number}, column {err.colno}: {err.msg}"
    return None


def _unreadable_files_error(source: str, files: list[str], err: BaseException) -> DatasetError:
    cause = _root_cause(err)
    said = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
    for file in files:
        if os.path.splitext(file)[1].lower() in (".json", ".jsonl"):
            where = _json_problem(file)
            if where is not None:
                return DatasetError(f"Dataset file {file} is not valid JSON or JSON Lines: {where}. Fix the file.")
    named = files[0] if len(files) == 1 else f"one of {files[:5]}" + (" ..." if len(files) > 5 else "")
    kind = {"json": "JSON", "csv": "CSV", "parquet": "Parquet", "text": "text", "arrow": "Arrow"}.get(source, source)
    return DatasetError(
        f"Could not read dataset file {named} as {kind}: {type(cause).__name__}: {said}. Check that the file is "
        "complete and in the format its builder (`source`) expects."
    )


def describe_source(source: str, load_dataset_kwargs: dict) -> str:
    """``source`` plus its ``data_files`` when given (``"json"`` alone does not say which file)."""
    data_files = load_dataset_kwargs.get("data_files")
    return f"{source}:{data_files}" if data_files else source


def check_columns(ds, required: Sequence[str], source: str, hint: str = "column_map") -> None:
    """Raises a DatasetError naming the expected and the available columns when any required one is missing."""
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise DatasetError(
            f"Dataset {source!r} has no column(s) {missing}. Expected columns: {list(required)}; available: "
            f"{ds.column_names}. Rename them in the data or map them with {hint}."
        )


def row_error(source: str, index: int, row: dict[str, Any], err: BaseException, required: Sequence[str] = ()):
    """The error for row ``index`` that a transform or tokenizer refused, naming the row and, when the row lacks a
    column the transform needs (JSON rows without the key, or null), that column."""
    said = str(err).strip() or type(err).__name__
    absent = [c for c in required if row.get(c) is None and repr(c) in said]
    if absent:
        which = ", ".join(repr(c) for c in absent)
        return DatasetError(
            f"Dataset {source!r}, row {index}: {said.rstrip('.')}: column {which} is missing (or null) in this row. "
            f"Every row needs {list(required)}: fill it in, or drop the row with filter_fn."
        )
    return DatasetError(f"Dataset {source!r}, row {index}: {said}")


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
        raise DatasetError(f"Dataset {source!r} is empty: check source, data_files and split.")
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
    state = tokenizer.__getstate__()  # what pickles: not the caches a tokenizer builds as it is used
    values = state.values() if isinstance(state, dict) else vars(tokenizer).values()
    classes.update(type(value) for value in values if type(value).__module__.split(".")[0] == package)
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
    tokens: list[int], mask: list[bool], max_seq_len: int | None, eos_id: int, keeps_mask: bool = False
) -> tuple[list[int], list[bool], bool]:
    """Cuts a sample to ``max_seq_len`` tokens; returns ``(tokens, mask, was_truncated)``.

    As the tokenizers' own truncation (:func:`tune.data.truncate`) does: a sample that ended with EOS still ends
    with EOS, and that forced EOS gets no loss (the text did not really end there), or with ``keeps_mask`` (the
    tokenizer's ``truncation_keeps_mask``) the mask of the token it replaces.
    """
    if max_seq_len is None or len(tokens) <= max_seq_len:
        return tokens, mask, False
    ends_with_eos = tokens[-1] == eos_id
    tokens, mask = tokens[:max_seq_len], mask[:max_seq_len]
    if ends_with_eos:
        tokens[-1] = eos_id
        mask[-1] = mask[-1] if keeps_mask else True
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


def token_columns(encoded, max_seq_len: int | None, eos_id: int, keeps_mask: bool = False):
    """``tokens`` and ``labels`` list columns of tokenised samples, cut to ``max_seq_len`` as :func:`truncate` does
    (``keeps_mask`` as there), and which samples were cut.

    ``encoded`` is a :class:`~tune.data._tokenizers._utils.FlatEncoding` (samples end to end, a trained flag per
    token): the columns are built over its flat buffers and cut in array operations over all samples at once,
    without converting each token through pyarrow's per-element path.

    Returns:
        tuple: ``(tokens, labels, truncated)``: two pyarrow ``list<int32>`` arrays and a ``bool`` array.
    """
    import pyarrow as pa

    tokens = np.frombuffer(encoded.tokens, dtype=np.int32) if len(encoded.tokens) else np.zeros(0, np.int32)
    trained = np.frombuffer(encoded.trainable, dtype=np.bool_) if len(encoded.trainable) else np.zeros(0, np.bool_)
    if len(trained) != len(tokens):
        raise ValueError("a tokenizer returned trainable flags whose length differs from its tokens'.")
    lengths = np.asarray(encoded.lengths, dtype=np.int64)
    cuts = lengths > max_seq_len if max_seq_len is not None else np.zeros(len(lengths), dtype=np.bool_)
    if cuts.any():
        starts = np.cumsum(lengths) - lengths
        ends_with_eos = tokens[starts + lengths - 1] == eos_id
        position = np.arange(len(tokens)) - np.repeat(starts, lengths)
        keep = position < max_seq_len
        tokens, trained = tokens[keep], trained[keep]  # copies: the buffers stay as they were
        lengths = np.minimum(lengths, max_seq_len)
        last = (np.cumsum(lengths) - 1)[cuts & ends_with_eos]
        tokens[last] = eos_id
        if not keeps_mask:
            trained[last] = False  # the text did not end there: a forced EOS, not trained
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    labels = np.where(trained, tokens, np.int32(CROSS_ENTROPY_IGNORE_IDX))
    offsets_array = pa.array(offsets)
    return (
        pa.ListArray.from_arrays(offsets_array, pa.array(tokens)),
        pa.ListArray.from_arrays(offsets_array, pa.array(labels)),
        pa.array(cuts, pa.bool_()),
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
