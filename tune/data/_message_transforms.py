"""Turn dataset rows into lists of :class:`~tune.data.Message`.

Each transform is a small callable object: ``transform(row) -> {"messages": [...]}`` (or ``{"chosen": [...],
"rejected": [...]}`` for preference data). It knows which columns it reads (``required_columns``), so a dataset
can check them once against the table before touching any row, and it raises ``ValueError`` naming the column
for bad content; the dataset adds the row index to that message.

Masking follows ``train_on_input``: when False, every turn that is not the assistant's gets ``masked=True`` (no
loss); when True only an injected ``new_system_prompt`` stays masked.

Images: the conversation transforms and :class:`InputOutputToMessages` read an optional image column (``image``, or
``column_map["image"]``) holding a path, URL, ``datasets.Image`` value or a list of them; the images are loaded as
the row is transformed and become ``{"type": "image", "content": PIL.Image.Image}`` parts of the user turns.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tune.data._image import load_image
from tune.data._masking import mask_messages
from tune.data._messages import Message
from tune.data._multimodal_messages import attach_images, load_row_images, resolve_image

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


def _resolve_column_map(
    column_map: Mapping[str, str] | None, defaults: tuple[str, ...], owner: str, optional: tuple[str, ...] = ()
) -> dict:
    """Maps each expected key (and each ``optional`` one) to the dataset column that holds it; rejects keys the
    transform does not know."""
    column_map = dict(column_map or {})
    known = defaults + optional
    unknown = sorted(set(column_map) - set(known))
    if unknown:
        also = f", and optionally {list(optional)}" if optional else ""
        raise ValueError(
            f"{owner}: column_map has unknown key(s) {unknown}; the keys it accepts are {list(defaults)}{also} "
            f"(each maps to the name of a column in your data)."
        )
    return {key: column_map.get(key, key) for key in known}


def _text(row: Mapping[str, Any], column: str, *, allow_empty: bool = False) -> str:
    value = row[column]
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"column {column!r} must hold a string, got {type(value).__name__} ({value!r:.60}).")
    if not value.strip() and not allow_empty:
        raise ValueError(f"column {column!r} is empty; remove the row or fill it (e.g. with filter_fn).")
    return value


def _image_column_required(column_map: Mapping[str, str] | None, image_dir: Any) -> bool:
    # A text dataset has no image column; naming one, or an image_dir, says the data must have it.
    return image_dir is not None or "image" in (column_map or {})


def _row_images(row: Mapping[str, Any], column: str, image_dir: Any) -> list[Any]:
    """The loaded images of the row's image column; [] when the row has no such column or it is null."""
    return load_row_images(row[column], column, image_dir) if column in row else []


def _system(new_system_prompt: str | None) -> list[Message]:
    # An injected system prompt is an instruction to the model, never a training target.
    return [Message(role="system", content=new_system_prompt, masked=True)] if new_system_prompt else []


class InputOutputToMessages:
    """One user turn (column ``input``) and one assistant turn (column ``output``).

    Args:
        train_on_input (bool): compute loss on the user turn too. Default False.
        column_map (Mapping[str, str] | None): ``{"input": "question", "output": "answer"}`` to read other columns.
        new_system_prompt (str | None): prepend this system message to every conversation (always masked).
        image_dir (Path | None): directory that relative image paths are read from. When the row has an image
            column (``image``, or ``column_map["image"]``), its images go before the user's text.

    Raises:
        ValueError: for a column_map key other than ``input``/``output``/``image``.
    """

    def __init__(
        self,
        train_on_input: bool = False,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
        image_dir: "Path | None" = None,
    ) -> None:
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.image_dir = image_dir
        self._needs_image = _image_column_required(column_map, image_dir)
        self.column_map = _resolve_column_map(column_map, ("input", "output"), type(self).__name__, ("image",))

    @property
    def required_columns(self) -> list[str]:
        columns = [self.column_map["input"], self.column_map["output"]]
        return columns + [self.column_map["image"]] if self._needs_image else columns

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        prompt = _text(row, self.column_map["input"])
        answer = _text(row, self.column_map["output"])
        images = _row_images(row, self.column_map["image"], self.image_dir)
        messages = _system(self.new_system_prompt)
        if images:
            prompt = [*({"type": "image", "content": image} for image in images), {"type": "text", "content": prompt}]
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
    content_parts: Callable[[list, str], list[dict[str, Any]]] | None = None,
) -> list[Message]:
    """Validates a list of ``{role_key: ..., content_key: ...}`` dicts and builds the messages.

    With ``content_parts``, a content that is a list (of typed parts) is converted by it; else content is text."""
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
        if isinstance(content, list) and content_parts is not None:
            content = content_parts(content, where)
            if not content:
                raise ValueError(f"{where}: content is an empty list of parts.")
        elif not isinstance(content, str):
            allowed = "a string or a list of parts" if content_parts is not None else "a string"
            raise ValueError(f"{where}: content must be {allowed}, got {type(content).__name__}.")
        elif not content.strip():
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
        image_dir (Path | None): directory that relative image paths are read from.
        image_tag (str | None): the placeholder in the user turns' text that each image of the row replaces, in
            order; None puts the images before the first user turn's text. Has no effect on rows without images.
        masking_strategy (str | None): ``"train_on_assistant"``, ``"train_on_all"`` or ``"train_on_last"`` (only
            the final assistant turn); None follows ``train_on_input``.

    The images of a row are read from its image column (``image``, or ``column_map["image"]``): a path, URL,
    ``datasets.Image`` value, or a list of them.

    Raises:
        ValueError: for an unknown column_map key or masking strategy, or both ``train_on_input`` and
            ``masking_strategy``.
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
        self.image_dir = image_dir
        self.image_tag = image_tag
        _check_masking(train_on_input, masking_strategy, type(self).__name__)
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.masking_strategy = masking_strategy
        self._needs_image = _image_column_required(column_map, image_dir)
        self.column_map = _resolve_column_map(column_map, ("conversations",), type(self).__name__, ("image",))

    @property
    def required_columns(self) -> list[str]:
        columns = [self.column_map["conversations"]]
        return columns + [self.column_map["image"]] if self._needs_image else columns

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        column = self.column_map["conversations"]
        messages = _conversation(
            row[column], column, role_key="from", content_key="value", role_map=self._ROLE_MAP,
            train_on_input=self.train_on_input, new_system_prompt=self.new_system_prompt,
            masking_strategy=self.masking_strategy,
        )  # fmt: skip
        attach_images(messages, _row_images(row, self.column_map["image"], self.image_dir), self.image_tag)
        return {"messages": messages}


class OpenAIToMessages:
    """OpenAI chat format: a list of ``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``.

    ``content`` is a string or a list of parts: ``{"type": "text", "text": ...}``,
    ``{"type": "image_url", "image_url": {"url": ...}}`` (OpenAI's), or ``{"type": "image", "image"|"url"|"path":
    ...}`` (the Hugging Face processors'). Image parts are loaded in place; relative paths are read from
    ``image_dir``.

    Args:
        train_on_input (bool): compute loss on non-assistant turns too. Default False.
        column_map (Mapping[str, str] | None): ``{"messages": "my_column"}``, and ``"image"`` for a column of
            images kept outside the messages (a path, URL, ``datasets.Image`` value or a list of them).
        new_system_prompt (str | None): replaces any system turn of the data (always masked).
        masking_strategy (str | None): ``"train_on_assistant"``, ``"train_on_all"`` or ``"train_on_last"`` (only
            the final assistant turn); None follows ``train_on_input``.
        image_dir (Path | None): directory that relative image paths are read from.
        image_tag (str | None): for an image column: the placeholder in the user turns' text that each image
            replaces; None puts them before the first user turn's text.

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
        image_dir: "Path | None" = None,
        image_tag: str | None = None,
    ) -> None:
        _check_masking(train_on_input, masking_strategy, type(self).__name__)
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt
        self.masking_strategy = masking_strategy
        self.image_dir = image_dir
        self.image_tag = image_tag
        # image_dir alone serves the paths inside the messages; only a mapped "image" column is required
        self._needs_image = "image" in (column_map or {})
        self.column_map = _resolve_column_map(column_map, ("messages",), type(self).__name__, ("image",))

    @property
    def required_columns(self) -> list[str]:
        columns = [self.column_map["messages"]]
        return columns + [self.column_map["image"]] if self._needs_image else columns

    def _parts(self, content: list, where: str) -> list[dict[str, Any]]:
        """OpenAI / Hugging Face content parts -> tune's, with the images loaded."""
        parts = []
        for number, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
                continue
            if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
                location = part["image_url"].get("url")
            elif kind == "image":
                location = next((part[key] for key in ("image", "url", "path") if part.get(key) is not None), None)
            else:
                raise ValueError(
                    f"{where}, part {number}: expected {{'type': 'text', 'text': ...}}, "
                    f"{{'type': 'image_url', 'image_url': {{'url': ...}}}} or {{'type': 'image', 'image': ...}}, "
                    f"got {part!r:.80}."
                )
            if location is None:
                raise ValueError(f"{where}, part {number}: the image part names no image: {part!r:.80}.")
            try:
                parts.append({"type": "image", "content": load_image(resolve_image(location, self.image_dir))})
            except (ValueError, TypeError) as err:
                raise type(err)(f"{where}, part {number}: {err}") from err
        return parts

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        column = self.column_map["messages"]
        messages = _conversation(
            row[column], column, role_key="role", content_key="content", role_map=self._ROLE_MAP,
            train_on_input=self.train_on_input, new_system_prompt=self.new_system_prompt,
            masking_strategy=self.masking_strategy, content_parts=self._parts,
        )  # fmt: skip
        attach_images(messages, _row_images(row, self.column_map["image"], self.image_dir), self.image_tag)
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
