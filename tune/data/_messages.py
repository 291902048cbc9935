from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool", "ipython"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool", "ipython")


def _content_parts(content: Any, role: str) -> list[dict[str, Any]]:
    """``content`` as a list of ``{"type": ..., "content": ...}`` parts (a string becomes one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if not isinstance(content, list):
        raise ValueError(
            f"Message content must be a string or a list of {{'type': ..., 'content': ...}} parts, got "
            f"{type(content).__name__} for role {role!r}."
        )
    for index, part in enumerate(content):
        if not isinstance(part, dict) or "type" not in part or "content" not in part:
            raise ValueError(
                f"part {index} of a {role!r} message must be a dict with 'type' and 'content' keys, got {part!r:.80}."
            )
        if part["type"] == "text" and not isinstance(part["content"], str):
            raise ValueError(
                f"text part {index} of a {role!r} message must hold a string, got {type(part['content']).__name__}."
            )
    return content


def _join_text(parts: list[dict[str, Any]]) -> str:
    if len(parts) == 1:
        part = parts[0]
        return part["content"] if part["type"] == "text" else ""
    return "".join(part["content"] for part in parts if part["type"] == "text")


class Message:
    """One turn of a conversation.

    Args:
        role (str): ``"system"``, ``"user"``, ``"assistant"``, ``"ipython"`` (a tool's result, torchtune's and
            Llama 3's name) or ``"tool"`` (the same, under the name other families use).
        content (str | list[dict[str, Any]]): the text of the turn, or a list of typed parts
            ``[{"type": "text", "content": "..."}, ...]`` (a string is stored as one text part). Parts of other
            types (``"image"``) can be held, but tune's tokenizers are text-only and reject them.
        masked (bool): when True the turn's tokens get no loss (label ``-100``). Which turns are masked is
            decided by the masking strategy that builds the messages, not here.
        ipython (bool): the turn is a tool call written by the assistant (Llama 3 opens it with
            ``<|python_tag|>``). Only assistant messages can be tool calls.
        eot (bool): whether the turn ends with the format's end-of-turn token (False for a turn the model is
            meant to continue, e.g. a generation prompt).

    Attributes:
        content (list[dict[str, Any]]): the parts. Assign a new list to change it; the text is read from the
            parts when they are assigned, so editing a part in place does not change :attr:`text_content`.

    Raises:
        ValueError: for an unknown role, content that is neither a string nor a list of parts, a text part that
            is not a string, or ``ipython=True`` on a message that is not an assistant's or that holds media.
    """

    # The text is kept as given and the parts are built on first use of ``content``: a sample makes a few
    # messages and the chat formats read only their text (``_text``), so this keeps building them cheap.
    __slots__ = ("role", "_text", "_parts", "masked", "ipython", "eot")

    def __init__(
        self,
        role: Role,
        content: "str | list[dict[str, Any]]",
        masked: bool = False,
        ipython: bool = False,
        eot: bool = True,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"Unknown message role {role!r}; expected one of {', '.join(ROLES)}.")
        self.role = role
        if type(content) is str:
            self._text = content
            self._parts = None
        else:
            self.content = content
        self.masked = masked
        self.ipython = ipython
        self.eot = eot
        if ipython:
            if role != "assistant":
                raise ValueError(f"Only assistant messages can be tool calls (ipython=True); got role {role!r}.")
            if self.contains_media:
                raise ValueError("A tool call (ipython=True) cannot hold media.")

    @property
    def content(self) -> list[dict[str, Any]]:
        if self._parts is None:
            self._parts = [{"type": "text", "content": self._text}]
        return self._parts

    @content.setter
    def content(self, value: "str | list[dict[str, Any]]") -> None:
        self._parts = _content_parts(value, self.role)
        self._text = _join_text(self._parts)

    @property
    def text_content(self) -> str:
        """The text parts joined, without separators."""
        return self._text

    @property
    def contains_media(self) -> bool:
        """Whether any part is not text (an image)."""
        return self._parts is not None and any(part["type"] != "text" for part in self._parts)

    def get_media(self) -> list[Any]:
        """The content of the image parts, in order."""
        return [part["content"] for part in self.content if part["type"] == "image"]

    @classmethod
    def from_dict(cls, d: dict) -> "Message":
        """Builds a message from ``{"role": ..., "content": ..., "masked": ..., "ipython": ..., "eot": ...}``
        (only ``role`` and ``content`` required)."""
        return cls(
            role=d["role"],
            content=d["content"],
            masked=d.get("masked", False),
            ipython=d.get("ipython", False),
            eot=d.get("eot", True),
        )

    def to_dict(self) -> dict:
        """The fields as a dict that :meth:`from_dict` reads back."""
        return {
            "role": self.role,
            "content": self.content,
            "masked": self.masked,
            "ipython": self.ipython,
            "eot": self.eot,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.role, self.content, self.masked, self.ipython, self.eot) == (
            other.role,
            other.content,
            other.masked,
            other.ipython,
            other.eot,
        )

    __hash__ = None  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        flags = "".join(
            f", {name}={value!r}"
            for name, value, default in (("masked", self.masked, False), ("ipython", self.ipython, False),
                                         ("eot", self.eot, True))
            if value != default
        )  # fmt: skip
        content = self._text if not self.contains_media else [part["content"] for part in self._parts]
        return f"Message(role={self.role!r}, content={content!r}{flags})"
