"""Turn dataset rows into lists of :class:`~tune.data.Message`.

Each transform is a small callable object: ``transform(row) -> {"messages": [...]}`` (or ``{"chosen": [...],
"rejected": [...]}`` for preference data). It knows which columns it reads (``required_columns``), so a dataset
can check them once against the table before touching any row, and it raises ``ValueError`` naming the column
for bad content; the dataset adds the row index to that message.

Masking follows ``train_on_input``: when False, every turn that is not the assistant's gets ``masked=True`` (no
loss); when True only an injected ``new_system_prompt`` stays masked.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tune.data._masking import mask_messages
from tune.data._messages import Message

# The prompt of the Stanford Alpaca project (https://github.com/tatsu-lab/stanford_alpaca, train.py), with and
# without the optional "input" field. Kept verbatim: models fine-tuned on alpaca data expect exactly this text.
_ALPACA_HEADER_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
)
_ALPACA_HEADER_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
)


def alpaca_prompt(instruction: str, input: str = "") -> str:
    """Returns the Alpaca prompt for an instruction and an optional input (the text before the response).

    Args:
        instruction (str): the task.
        input (str): optional context; the prompt variant without an ``### Input:`` section is used when empty.

    Returns:
        str: the prompt, ending in ``"### Response:\\n"``.
    """
    if input:
        return f"{_ALPACA_HEADER_WITH_INPUT}### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
    return f"{_ALPACA_HEADER_NO_INPUT}### Instruction:\n{instruction}\n\n### Response:\n"


def _resolve_column_map(column_map: Mapping[str, str] | None, defaults: tuple[str, ...], owner: str) -> dict:
    """Maps each expected key to the dataset column that holds it; rejects keys the transform does not know."""
    column_map = dict(column_map or {})
    unknown = sorted(set(column_map) - set(defaults))
    if unknown:
        raise ValueError(
            f"{owner}: column_map has unknown key(s) {unknown}; the keys it accepts are {list(defaults)} "
            f"(each maps to the name of a column in your data)."
        )
    return {key: column_map.get(key, key) for key in defaults}


def _text(row: Mapping[str, Any], column: str, *, allow_empty: bool = False) -> str:
    value = row[column]
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"column {column!r} must hold a string, got {type(value).__name__} ({value!r:.60}).")
    if not value.strip() and not allow_empty:
        raise ValueError(f"column {column!r} is empty; remove the row or fill it (e.g. with filter_fn).")
    return value


def _check_text_only(image_dir: Any, owner: str) -> None:
    if image_dir is not None:
        raise ValueError(
            f"{owner}: image_dir={image_dir!r} was given, but tune is text-only for now (no image loading); "
            "leave image_dir as None."
        )


def _system(new_system_prompt: str | None) -> list[Message]:
    # An injected system prompt is an instruction to the model, never a training target.
    return [Message(role="system", content=new_system_prompt, masked=True)] if new_system_prompt else []


class InputOutputToMessages:
    """One user turn (column ``input``) and one assistant turn (column ``output``).

    Args:
        train_on_input (bool): compute loss on the user turn too. Default False.
        column_map (Mapping[str, str] | None): ``{"input": "question", "output": "answer"}`` to read other columns.
        new_system_prompt (str | None): prepend this system message to every conversation (always masked).
        image_dir (Path | None): torchtune's directory of images; tune is text-only, so it must be None.

    Raises:
        ValueError: for a column_map key other than ``input``/``output``, or an ``image_dir``.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
        image_dir: "Path | None" = None,
    ) -> None:
        _check_text_only(image_dir, type(self).__name__)
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.column_map = _resolve_column_map(column_map, ("input", "output"), type(self).__name__)

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        prompt = _text(row, self.column_map["input"])
        answer = _text(row, self.column_map["output"])
        messages = _system(self.new_system_prompt)
        messages.append(Message(role="user", content=prompt, masked=not self.train_on_input, eot=True))
        messages.append(Message(role="assistant", content=answer, masked=False, eot=True))
        return {"messages": messages}


class AlpacaToMessages:
    """Alpaca rows (``instruction``, optional ``input``, ``output``) to a user prompt and an assistant answer.

    The user turn is :func:`alpaca_prompt` of the instruction and input; the answer is ``output``.

    Args:
        train_on_input (bool): compute loss on the prompt too. Default True, as in the Alpaca recipe.
        column_map (Mapping[str, str] | None): names of the ``instruction``, ``input`` and ``output`` columns.

    Raises:
        ValueError: for an unknown column_map key.
    """

    def __init__(self, train_on_input: bool = True, column_map: Mapping[str, str] | None = None) -> None:
        self.train_on_input = train_on_input
        self.column_map = _resolve_column_map(column_map, ("instruction", "input", "output"), type(self).__name__)

    @property
    def required_columns(self) -> list[str]:
        # "input" may be absent altogether (prompt without context); instruction and output may not.
        return [self.column_map["instruction"], self.column_map["output"]]

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        instruction = _text(row, self.column_map["instruction"])
        input_column = self.column_map["input"]
        context = _text(row, input_column, allow_empty=True) if input_column in row else ""
        answer = _text(row, self.column_map["output"])
        return {
            "messages": [
                Message(role="user", content=alpaca_prompt(instruction, context), masked=not self.train_on_input),
                Message(role="assistant", content=answer, masked=False),
            ]
        }


def _conversation(
    turns: Any,
    column: str,
    *,
    role_key: str,
    content_key: str,
    role_map: Mapping[str, str],
    train_on_input: bool,
    new_system_prompt: str | None,
    masking_strategy: str | None = None,
) -> list[Message]:
    """Validates a list of ``{role_key: ..., content_key: ...}`` dicts and builds the messages."""
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"column {column!r} must hold a non-empty list of turns, got {turns!r:.80}.")
    messages = _system(new_system_prompt)
    for turn_index, turn in enumerate(turns):
        where = f"column {column!r}, turn {turn_index}"
        if not isinstance(turn, Mapping) or role_key not in turn or content_key not in turn:
            raise ValueError(f"{where}: expected a dict with keys {role_key!r} and {content_key!r}, got {turn!r:.80}.")
        role = role_map.get(turn[role_key])
        if role is None:
            raise ValueError(f"{where}: unknown role {turn[role_key]!r}; expected one of {sorted(role_map)}.")
        if role == "system" and new_system_prompt:
            continue  # replaced by the new system prompt
        content = turn[content_key]
        if not isinstance(content, str):
            raise ValueError(f"{where}: content must be a string, got {type(content).__name__}.")
        if not content.strip():
            if role == "system":
                continue  # an empty system prompt says nothing (SlimOrca has some); the turn is dropped
            raise ValueError(f"{where}: content is empty.")
        masked = role != "assistant" and not train_on_input
        messages.append(Message(role=role, content=content, masked=masked))
    if not any(m.role == "assistant" for m in messages):
        raise ValueError(f"column {column!r}: the conversation has no assistant turn, so nothing would be trained.")
    if masking_strategy is not None:
        mask_messages(messages, masking_strategy)
        if new_system_prompt:
            messages[0].masked = True
    return messages


def _check_masking(train_on_input: bool, masking_strategy: str | None, owner: str) -> None:
    if masking_strategy is not None:
        if train_on_input:
            raise ValueError(
                f"{owner}: set either train_on_input=True or masking_strategy={masking_strategy!r}, not both "
                f"(masking_strategy='train_on_all' is train_on_input=True)."
            )
        mask_messages([], masking_strategy)  # validates the name now rather than at the first row


class ShareGPTToMessages:
    """ShareGPT conversations: a list of ``{"from": "system"|"human"|"gpt", "value": text}``.

    Args:
        train_on_input (bool): compute loss on system and user turns too. Default False.
        column_map (Mapping[str, str] | None): ``{"conversations": "my_column"}``.
        new_system_prompt (str | None): replaces any system turn of the data (always masked).
        image_dir (Path | None): torchtune's directory of images; tune is text-only, so it must be None.
        image_tag (str | None): torchtune's image placeholder in the text; has no effect without images.
        masking_strategy (str | None): ``"train_on_assistant"``, ``"train_on_all"`` or ``"train_on_last"`` (only
            the final assistant turn); None follows ``train_on_input``.

    Raises:
        ValueError: for an unknown column_map key or masking strategy, both ``train_on_input`` and
            ``masking_strategy``, or an ``image_dir``.
    """

    _ROLE_MAP = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
        image_dir: "Path | None" = None,
        image_tag: str | None = "<image>",
        masking_strategy: str | None = None,
    ) -> None:
        _check_text_only(image_dir, type(self).__name__)
        self.image_tag = image_tag
        _check_masking(train_on_input, masking_strategy, type(self).__name__)
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.masking_strategy = masking_strategy
        self.column_map = _resolve_column_map(column_map, ("conversations",), type(self).__name__)

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        column = self.column_map["conversations"]
        messages = _conversation(
            row[column], column, role_key="from", content_key="value", role_map=self._ROLE_MAP,
            train_on_input=self.train_on_input, new_system_prompt=self.new_system_prompt,
            masking_strategy=self.masking_strategy,
        )  # fmt: skip
        return {"messages": messages}


class OpenAIToMessages:
    """OpenAI chat format: a list of ``{"role": "system"|"user"|"assistant"|"tool", "content": text}``.

    Args:
        train_on_input (bool): compute loss on non-assistant turns too. Default False.
        column_map (Mapping[str, str] | None): ``{"messages": "my_column"}``.
        new_system_prompt (str | None): replaces any system turn of the data (always masked).
        masking_strategy (str | None): ``"train_on_assistant"``, ``"train_on_all"`` or ``"train_on_last"`` (only
            the final assistant turn); None follows ``train_on_input``.

    Raises:
        ValueError: for an unknown column_map key or masking strategy, or both ``train_on_input`` and
            ``masking_strategy``.
    """

    _ROLE_MAP = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "ipython": "ipython"}

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
        masking_strategy: str | None = None,
    ) -> None:
        _check_masking(train_on_input, masking_strategy, type(self).__name__)
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.masking_strategy = masking_strategy
        self.column_map = _resolve_column_map(column_map, ("messages",), type(self).__name__)

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        column = self.column_map["messages"]
        messages = _conversation(
            row[column], column, role_key="role", content_key="content", role_map=self._ROLE_MAP,
            train_on_input=self.train_on_input, new_system_prompt=self.new_system_prompt,
            masking_strategy=self.masking_strategy,
        )  # fmt: skip
        return {"messages": messages}


class ChosenRejectedToMessages:
    """Preference rows: columns ``chosen`` and ``rejected``, each a list of OpenAI-style messages.

    Both conversations normally share the prompt and differ in the final assistant turn.

    Args:
        train_on_input (bool): compute loss on non-assistant turns too. Default False.
        column_map (Mapping[str, str] | None): ``{"chosen": ..., "rejected": ...}``.
        new_system_prompt (str | None): replaces any system turn of the data (always masked).

    Raises:
        ValueError: for an unknown column_map key.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.column_map = _resolve_column_map(column_map, ("chosen", "rejected"), type(self).__name__)

    @property
    def required_columns(self) -> list[str]:
        return list(self.column_map.values())

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        out = {}
        for key in ("chosen", "rejected"):
            column = self.column_map[key]
            out[key] = _conversation(
                row[column], column, role_key="role", content_key="content", role_map=OpenAIToMessages._ROLE_MAP,
                train_on_input=self.train_on_input, new_system_prompt=self.new_system_prompt,
            )  # fmt: skip
        return out
