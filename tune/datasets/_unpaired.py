"""Unpaired feedback for KTO: each example is a prompt, one completion and whether it is desirable.

Rows are tokenised once and cached like the other builders. Every sample also carries its *KL row*: its own prompt
followed by the completion of another example (its KL partner), which the KTO loss uses to estimate the KL term.
The partner is a property of the dataset, not of the batches: rows are taken in consecutive groups of
``kl_group_size`` and the completions rotated by one within each group (the first row of a group gets the group's
last completion, every other row its predecessor's), the pairing TRL's ``KTOTrainer`` builds with groups of
``per_device_train_batch_size``.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

from tune.data import CROSS_ENTROPY_IGNORE_IDX, ChosenRejectedToMessages, Message, ModelTokenizer
from tune.datasets import _hf
from tune.datasets._sft import _TokenizeConversations, log_truncated

# the keys of an unpaired sample as tokenised, and the keys its KL row adds
UNPAIRED_KEYS = ("input_ids", "labels", "label")
KL_KEYS = ("kl_input_ids", "kl_labels")
_OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "ipython": "ipython"}


def kl_partner_index(index: int, num_rows: int, kl_group_size: int) -> int:
    """The row whose completion forms the KL row of row ``index``: rotation by one within consecutive groups of
    ``kl_group_size`` rows (the last group may be shorter).

    Args:
        index (int): the row.
        num_rows (int): rows in the dataset.
        kl_group_size (int): rows per group (TRL: ``per_device_train_batch_size``).

    Returns:
        int: the partner's index (``index`` itself in a group of one row).
    """
    start = index - index % kl_group_size
    size = min(kl_group_size, num_rows - start)
    return start + (index - start - 1) % size


def _completion_start(labels: Sequence[int]) -> int:
    # the prompt is every token before the first trained one
    for position, label in enumerate(labels):
        if label != CROSS_ENTROPY_IGNORE_IDX:
            return position
    return len(labels)


def kl_row(
    sample: Mapping[str, Sequence[int]], partner: Mapping[str, Sequence[int]], max_seq_len: int | None = None
) -> tuple[list[int], list[int]]:
    """The KL row of ``sample``: its prompt tokens then ``partner``'s completion tokens (and their labels).

    Args:
        sample (Mapping): ``input_ids`` and ``labels`` of the example (labels ``-100`` on the prompt).
        partner (Mapping): the same of its KL partner.
        max_seq_len (int | None): cut the row to this many tokens. Default None.

    Returns:
        tuple[list[int], list[int]]: ``(kl_input_ids, kl_labels)``.
    """
    prompt_end = _completion_start(sample["labels"])
    completion_start = _completion_start(partner["labels"])
    tokens = list(sample["input_ids"][:prompt_end]) + list(partner["input_ids"][completion_start:])
    labels = [CROSS_ENTROPY_IGNORE_IDX] * prompt_end + list(partner["labels"][completion_start:])
    if max_seq_len is not None:
        tokens, labels = tokens[:max_seq_len], labels[:max_seq_len]
    return tokens, labels


class UnpairedPreferenceDataset(Dataset):
    """Unpaired examples for KTO, each with its KL row.

    Wraps tokenised examples (``input_ids``, ``labels`` with ``-100`` on the prompt, ``label`` True for a desirable
    completion) in their order; with ``kl_group_size`` every item also has ``kl_input_ids`` and ``kl_labels``, the
    row's prompt followed by its KL partner's completion (:func:`kl_partner_index`). Batch the items with
    :func:`~tune.data.padded_collate_kto`.

    Args:
        examples (Sequence[Mapping]): the tokenised examples (a Hugging Face dataset or a list of dicts).
        kl_group_size (int | None): rows per rotation group; None: no KL rows (``apo_zero_unpaired`` needs none).
        max_seq_len (int | None): the length KL rows are cut to (the tokenizer's). Default None.

    Raises:
        ValueError: when ``kl_group_size < 1`` or an example lacks a key.
    """

    def __init__(
        self, examples: Sequence[Mapping[str, Any]], *, kl_group_size: int | None, max_seq_len: int | None = None
    ) -> None:
        if kl_group_size is not None and kl_group_size < 1:
            raise ValueError(f"kl_group_size must be >= 1 or None (no KL rows); got {kl_group_size}.")
        if len(examples) and not set(UNPAIRED_KEYS) <= set(examples[0]):
            raise ValueError(f"unpaired examples need the keys {list(UNPAIRED_KEYS)}; got {sorted(examples[0])}.")
        self._examples = examples
        self.kl_group_size = kl_group_size
        self.max_seq_len = max_seq_len

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        example = self._examples[index]
        sample = {key: example[key] for key in UNPAIRED_KEYS}
        sample["label"] = bool(sample["label"])
        if self.kl_group_size is not None:
            partner = self._examples[kl_partner_index(index, len(self), self.kl_group_size)]
            sample["kl_input_ids"], sample["kl_labels"] = kl_row(example, partner, self.max_seq_len)
        return sample


def _messages(value: Any, column: str, default_role: str) -> list[Message]:
    """A column's value as messages: a string is one turn of ``default_role``, a list holds OpenAI-style turns."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"column {column!r} is empty.")
        return [Message(role=default_role, content=value)]
    if not isinstance(value, list) or not value:
        raise ValueError(f"column {column!r} must hold a string or a non-empty list of messages, got {value!r:.80}.")
    messages = []
    for turn_index, turn in enumerate(value):
        if not isinstance(turn, Mapping) or turn.get("role") not in _OPENAI_ROLES or "content" not in turn:
            raise ValueError(
                f"column {column!r}, turn {turn_index}: expected {{'role': one of {sorted(_OPENAI_ROLES)}, "
                f"'content': ...}}, got {turn!r:.80}."
            )
        messages.append(Message(role=_OPENAI_ROLES[turn["role"]], content=turn["content"]))
    return messages


def _completion_only(messages: list[Message]) -> list[Message]:
    """Masks every turn but the trailing assistant turns (the completion); refuses a conversation without one."""
    end = len(messages)
    while end > 0 and messages[end - 1].role == "assistant":
        end -= 1
    if end == len(messages):
        raise ValueError("the conversation does not end with an assistant turn: there is no completion to score.")
    for position, message in enumerate(messages):
        message.masked = position < end
    return messages


class UnpairedToMessages:
    """TRL's unpaired preference rows: ``prompt`` and ``completion`` (strings, or lists of OpenAI-style messages) and
    ``label`` (True for a desirable completion).

    A string prompt becomes one user turn and a string completion one assistant turn; the prompt turns are masked,
    the completion's assistant turns are trained.

    Args:
        column_map (Mapping[str, str] | None): maps ``prompt``, ``completion``, ``label`` to your column names.
        new_system_prompt (str | None): replaces any system turn of the data (always masked).

    Raises:
        ValueError: for an unknown column_map key.
    """

    def __init__(self, column_map: Mapping[str, str] | None = None, new_system_prompt: str | None = None) -> None:
        column_map = dict(column_map or {})
        unknown = sorted(set(column_map) - {"prompt", "completion", "label"})
        if unknown:
            raise ValueError(
                f"UnpairedToMessages: column_map has unknown key(s) {unknown}; it accepts 'prompt', 'completion' "
                "and 'label' (each maps to a column of your data)."
            )
        self.column_map = {key: column_map.get(key, key) for key in ("prompt", "completion", "label")}
        self.new_system_prompt = new_system_prompt

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, Any]:
        prompt = _messages(row[self.column_map["prompt"]], self.column_map["prompt"], "user")
        completion = _messages(row[self.column_map["completion"]], self.column_map["completion"], "assistant")
        if self.new_system_prompt:
            prompt = [Message(role="system", content=self.new_system_prompt)] + [
                m for m in prompt if m.role != "system"
            ]
        label = row[self.column_map["label"]]
        if not isinstance(label, (bool, int)) or label not in (0, 1):
            raise ValueError(f"column {self.column_map['label']!r} must hold True or False, got {label!r}.")
        return {"messages": _completion_only(prompt + completion), "label": bool(label)}


class _TokenizeUnpaired(_TokenizeConversations):
    """Batched map function: rows -> one or more ``(messages, label)`` examples each -> tokens, labels, label."""

    def __init__(self, examples_of_row: Callable, tokenizer: ModelTokenizer, source: str) -> None:
        super().__init__(examples_of_row, tokenizer, source)

    def __call__(self, batch: dict[str, list], indices: list[int]):
        import pyarrow as pa

        tokens, masks, labels, cuts = [], [], [], []
        for row, index in zip(_hf.rows_of(batch), indices):
            try:
                examples = self.message_transform(row)
                encoded = [(self.encode(messages), label) for messages, label in examples]
            except (ValueError, TypeError, KeyError) as err:
                required = getattr(self.message_transform, "required_columns", ())
                raise _hf.row_error(self.source, index, row, err, required) from err
            for (ids, mask, cut), label in encoded:
                tokens.append(ids)
                masks.append(mask)
                labels.append(label)
                cuts.append(cut)
        return pa.table(
            {
                "input_ids": _hf.list_column(tokens),
                "labels": _hf.list_column(tokens, masks),
                "label": pa.array(labels, pa.bool_()),
                "truncated": pa.array(cuts, pa.bool_()),
            }
        )


class _UnpairedExamples:
    """Row -> ``[(messages, desirable)]``: one example per row of TRL's unpaired format."""

    def __init__(self, transform: UnpairedToMessages) -> None:
        self.transform = transform
        self.required_columns = transform.required_columns

    def __call__(self, row: Mapping[str, Any]) -> list[tuple[list[Message], bool]]:
        out = self.transform(row)
        return [(out["messages"], out["label"])]


class _PairExamples:
    """Row -> ``[(chosen, True), (rejected, False)]``: a preference pair as two unpaired examples."""

    def __init__(self, transform: ChosenRejectedToMessages) -> None:
        self.transform = transform
        self.required_columns = transform.required_columns

    def __call__(self, row: Mapping[str, Any]) -> list[tuple[list[Message], bool]]:
        pair = self.transform(row)
        return [(_completion_only(pair["chosen"]), True), (_completion_only(pair["rejected"]), False)]


def _tokenize(
    tokenizer: ModelTokenizer,
    examples_of_row: Callable,
    source: str,
    filter_fn: Callable | None,
    split: str,
    num_proc: int | None,
    load_dataset_kwargs: dict[str, Any],
):
    from datasets import Features, Sequence, Value

    raw = _hf.load_source(source, split=split, **load_dataset_kwargs)
    source = _hf.describe_source(source, load_dataset_kwargs)
    _hf.check_columns(raw, examples_of_row.required_columns, source)
    procs = _hf.resolve_num_proc(num_proc, len(raw))
    raw = _hf.filter_rows(raw, filter_fn, source, procs)
    source += " (after filter_fn; row numbers count kept rows)" if filter_fn is not None else ""
    function = _TokenizeUnpaired(examples_of_row, tokenizer, source)
    key = _hf.fingerprint(
        raw, "unpaired", _hf.code_identity(examples_of_row), _hf.code_identity(examples_of_row.transform),
        examples_of_row.transform, _hf.code_identity(function), _hf.tokenizer_identity(tokenizer),
        str(function.max_seq_len),
    )  # fmt: skip
    ids = Sequence(Value("int32"))
    features = Features({"input_ids": ids, "labels": ids, "label": Value("bool"), "truncated": Value("bool")})
    data = _hf.tokenize_rows(raw, function, features=features, num_proc=procs, new_fingerprint=key, desc="Tokenizing")
    log_truncated(data, source, function.max_seq_len)
    return data.select_columns(list(UNPAIRED_KEYS)), function.max_seq_len


def unpaired_preference_dataset(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    column_map: dict[str, str] | None = None,
    kl_group_size: int | None = None,
    new_system_prompt: str | None = None,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> UnpairedPreferenceDataset:
    """Unpaired feedback in TRL's format (e.g. ``trl-lib/kto-mix-14k``): columns ``prompt``, ``completion`` (strings
    or lists of OpenAI-style messages) and ``label`` (True: desirable).

    The conversation is tokenised with the model tokenizer's chat format; the prompt turns get no loss. With
    ``kl_group_size`` every sample also carries its KL row (see :class:`UnpairedPreferenceDataset`); TRL's pairing is
    ``kl_group_size`` equal to the batch size, with no shuffling.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
        column_map (dict[str, str] | None): maps ``prompt``/``completion``/``label`` to your column names.
        kl_group_size (int | None): rows per KL rotation group; None: no KL rows. Default None.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        filter_fn (Callable | None): keep a raw row when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        UnpairedPreferenceDataset: the tokenised examples, in the data's order.

    Raises:
        ValueError: for a missing column, empty data, a bad row (naming its index) or ``kl_group_size < 1``.
    """
    examples = _UnpairedExamples(UnpairedToMessages(column_map=column_map, new_system_prompt=new_system_prompt))
    data, max_seq_len = _tokenize(tokenizer, examples, source, filter_fn, split, num_proc, load_dataset_kwargs)
    return UnpairedPreferenceDataset(data, kl_group_size=kl_group_size, max_seq_len=max_seq_len)


def unpaired_from_pairs(
    tokenizer: ModelTokenizer,
    *,
    source: str,
    column_map: dict[str, str] | None = None,
    kl_group_size: int | None = None,
    new_system_prompt: str | None = None,
    filter_fn: Callable | None = None,
    split: str = "train",
    num_proc: int | None = None,
    **load_dataset_kwargs: Any,
) -> UnpairedPreferenceDataset:
    """Preference pairs (the data of :func:`~tune.datasets.preference_dataset`: ``chosen`` and ``rejected`` lists of
    messages) as unpaired feedback: each pair gives its chosen conversation as a desirable example and its rejected
    one as an undesirable example; the completion is the final assistant turn.

    Order: consecutive blocks of ``kl_group_size // 2`` pairs, each block's chosen examples then its rejected ones.
    Every KL group then holds as many desirable as undesirable examples, and rotation pairs each prompt with another
    prompt's completion (which needs ``kl_group_size`` even and at least 4). Without ``kl_group_size`` each pair's
    chosen example is followed by its rejected one.

    Args:
        tokenizer (ModelTokenizer): the model's tokenizer.
        source (str): hub name, builder with ``data_files``, directory or file.
        column_map (dict[str, str] | None): maps ``chosen``/``rejected`` to your column names.
        kl_group_size (int | None): rows per KL rotation group; None: no KL rows. Default None.
        new_system_prompt (str | None): replaces the data's system turns (masked).
        filter_fn (Callable | None): keep a raw row (a pair) when it returns True.
        split (str): split to load. Default ``"train"``.
        num_proc (int | None): tokenising processes; None picks by size.
        **load_dataset_kwargs: passed to ``datasets.load_dataset``.

    Returns:
        UnpairedPreferenceDataset: two examples per pair.

    Raises:
        ValueError: for ``kl_group_size`` odd or below 4, and as :func:`unpaired_preference_dataset`.
    """
    if kl_group_size is not None and (kl_group_size < 4 or kl_group_size % 2):
        raise ValueError(
            f"unpaired_from_pairs needs an even kl_group_size >= 4 (half the group chosen, half rejected, and no "
            f"prompt paired with its own pair's completion); got {kl_group_size}."
        )
    transform = ChosenRejectedToMessages(column_map=column_map, new_system_prompt=new_system_prompt)
    data, max_seq_len = _tokenize(
        tokenizer, _PairExamples(transform), source, filter_fn, split, num_proc, load_dataset_kwargs
    )
    # rows come as (chosen 0, rejected 0, chosen 1, ...): reorder into blocks of pairs, chosen rows first
    num_pairs = len(data) // 2
    block = 1 if kl_group_size is None else kl_group_size // 2
    order = []
    for start in range(0, num_pairs, block):
        pairs = range(start, min(start + block, num_pairs))
        order += [2 * pair for pair in pairs] + [2 * pair + 1 for pair in pairs]
    return UnpairedPreferenceDataset(data.select(order), kl_group_size=kl_group_size, max_seq_len=max_seq_len)
