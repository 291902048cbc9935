from typing import Protocol, runtime_checkable

from tune.data._messages import Message


@runtime_checkable
class BaseTokenizer(Protocol):
    """Text <-> token ids."""

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


@runtime_checkable
class ModelTokenizer(Protocol):
    """A family's tokenizer: encodes text and turns a conversation into tokens plus a loss mask.

    Attributes:
        bos_id, eos_id, pad_id (int): special ids (``pad_id`` is what collators pad with).
        stop_tokens (list[int]): ids that end generation (end of turn, end of text).
        max_seq_len (int | None): ``tokenize_messages`` truncates to this many tokens when set.
    """

    bos_id: int
    eos_id: int
    pad_id: int
    stop_tokens: list[int]
    max_seq_len: int | None

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def tokenize_messages(
        self, messages: list[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool]]:
        """Returns ``(tokens, mask)`` of equal length; ``mask[i]`` is True where token i gets NO loss.

        ``add_end_tokens=False`` leaves the conversation open for generation (a prompt ending in the
        assistant header).
        """
        ...
