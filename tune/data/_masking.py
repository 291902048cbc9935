"""Masking strategies: which turns of a conversation get a loss."""

from collections.abc import Sequence
from enum import Enum

from tune.data._messages import Message


class MaskingStrategy(str, Enum):
    """Which messages are trained on.

    - ``train_on_assistant`` (default): every assistant turn; system, user and tool turns are masked.
    - ``train_on_all``: every turn.
    - ``train_on_last``: only the last assistant turn (earlier ones become context).
    """

    TRAIN_ON_ALL = "train_on_all"
    TRAIN_ON_ASSISTANT = "train_on_assistant"
    TRAIN_ON_LAST = "train_on_last"


_ALIASES = {"all": "train_on_all", "assistant": "train_on_assistant", "last": "train_on_last"}


def _resolve(strategy: "MaskingStrategy | str") -> MaskingStrategy:
    if isinstance(strategy, MaskingStrategy):
        return strategy
    value = _ALIASES.get(strategy, strategy) if isinstance(strategy, str) else strategy
    try:
        return MaskingStrategy(value)
    except ValueError:
        allowed = ", ".join(repr(s.value) for s in MaskingStrategy)
        raise ValueError(
            f"Unknown masking strategy {strategy!r}; use one of {allowed} (or the short forms 'all', 'assistant', "
            "'last')."
        ) from None


def mask_messages(
    messages: Sequence[Message], masking_strategy: "MaskingStrategy | str" = MaskingStrategy.TRAIN_ON_ASSISTANT
) -> list[Message]:
    """Sets ``Message.masked`` on every message according to a masking strategy.

    The messages are updated in place (and returned as a list for convenience). The chat format then trains on
    the content and end-of-turn token of each unmasked turn (see ``tune.data._chat_formats``).

    Args:
        messages (Sequence[Message]): the conversation.
        masking_strategy (MaskingStrategy | str): ``"train_on_assistant"`` (default), ``"train_on_all"`` or
            ``"train_on_last"``; ``"assistant"``, ``"all"`` and ``"last"`` are accepted too.

    Returns:
        list[Message]: the same messages.

    Raises:
        ValueError: for an unknown strategy.
    """
    strategy = _resolve(masking_strategy)
    messages = list(messages)
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    for i, message in enumerate(messages):
        if strategy is MaskingStrategy.TRAIN_ON_ALL:
            message.masked = False
        elif strategy is MaskingStrategy.TRAIN_ON_ASSISTANT:
            message.masked = message.role != "assistant"
        else:
            message.masked = i != last_assistant
    return messages
