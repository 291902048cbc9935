from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant", "tool", "ipython"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool", "ipython")


@dataclass
class Message:
    """One turn of a conversation.

    Args:
        role (str): ``"system"``, ``"user"``, ``"assistant"``, ``"tool"`` (``"ipython"`` is accepted as
            Llama 3's name for tool output).
        content (str): the text of the turn.
        masked (bool): when True the turn's tokens get no loss (label ``-100``). Which turns are masked is
            decided by the masking strategy that builds the messages, not here.
        eot (bool): whether the turn ends with the format's end-of-turn token (False for a turn the model is
            meant to continue, e.g. a generation prompt).

    Raises:
        ValueError: for an unknown role or non-string content.
    """

    role: Role
    content: str
    masked: bool = False
    eot: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Unknown message role {self.role!r}; expected one of {', '.join(ROLES)}.")
        if not isinstance(self.content, str):
            raise ValueError(
                f"Message content must be a string, got {type(self.content).__name__} for role {self.role!r}."
            )

    @classmethod
    def from_dict(cls, d: dict) -> "Message":
        """Builds a message from ``{"role": ..., "content": ..., "masked": ...}``."""
        return cls(role=d["role"], content=d["content"], masked=d.get("masked", False), eot=d.get("eot", True))

    def to_dict(self) -> dict:
        return {"role": self.role, "content": self.content, "masked": self.masked, "eot": self.eot}
