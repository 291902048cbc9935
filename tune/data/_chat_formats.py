"""Chat formats: how each model family lays a conversation out as text and special tokens.

A chat format turns a list of :class:`~tune.data.Message` into a list of :class:`Segment` (a piece of text or one
special token) that says, piece by piece, whether it is trained on. A model tokenizer then encodes the segments
(see ``tune.data._tokenizers``) so that the tokens are exactly those of the family's Hugging Face chat template,
and each token is trained on when it overlaps a trained segment.

Which segments are trained follows from ``Message.masked`` (set by a masking strategy, see
:func:`~tune.data.mask_messages`):

- a turn's *content* and its *end-of-turn* marker are trained when the turn is not masked;
- a turn's *header* (role marker, BOS before a Llama 2 user turn, the newline between turns) is what a generation
  prompt supplies, so it is trained only when both the turn and the turn before it are trained. With the default
  strategy (train on assistant turns) exactly the assistant content and its end-of-turn token are trained; with
  ``train_on_all`` every token after the first header is;
- text a template adds on its own (BOS, Qwen 2.5's default system prompt) is never trained.

:class:`PlainChatFormat` (no template, torchtune's ``prompt_template=None`` layout) instead follows torchtune's
rule: every token, BOS and EOS included, carries its message's flag.

Every format reproduces the chat template of a named Hugging Face repository; the parity tests
(tests/tune/models/test_family_tokenizers.py) check token equality against ``apply_chat_template``.
"""

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from tune.data._messages import Message

# The formats read a message's text as ``message._text`` (what ``Message.text_content`` returns, without the
# property call): rendering is on the data loader's hot path.


class Segment(NamedTuple):
    """A piece of a rendered conversation.

    Args:
        text (str): the text, or the string of one special token when ``special`` is True.
        trainable (bool): whether tokens of this piece get a loss.
        special (bool): the text is a single special token (``<|eot_id|>``, ``</s>``, ...), looked up by name
            instead of being tokenized.
        separate (bool): the text is encoded on its own, not joined with the text around it (the layout without
            a chat template encodes every message separately, see :class:`PlainChatFormat`).
        trim_leading_whitespace (bool): with ``separate``, encode the text as it reads in the middle of a string:
            no SentencePiece dummy-prefix space before it.
    """

    text: str
    trainable: bool
    special: bool = False
    separate: bool = False
    trim_leading_whitespace: bool = False


class ChatFormat(Protocol):
    """Renders a conversation for one model family.

    Attributes:
        name (str): the family, used in error messages.
        roles (frozenset[str]): the message roles the format accepts.
    """

    name: str
    roles: frozenset[str]

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        """Returns the segments of ``messages``; ``add_end_tokens=False`` leaves the last turn open for generation
        (no end-of-turn after a final assistant turn; a generation prompt after a final non-assistant turn)."""
        ...


def check_messages(messages: Any, fmt: ChatFormat, *, add_end_tokens: bool = True) -> list[Message]:
    """Checks a conversation before rendering it with ``fmt`` and returns it as a list of :class:`Message`.

    Dicts with ``role``/``content`` keys are accepted and converted. ``add_end_tokens=False`` (the last turn left
    open) also allows an empty final assistant turn with ``eot=True``, as torchtune's generation recipe sends it.

    Raises:
        TypeError: if ``messages`` is not a list of messages.
        ValueError: for an empty conversation, a role the format does not support, media content (tune's
            tokenizers are text-only), or empty text (an empty final assistant turn with ``eot=False``, a
            generation prefix, is allowed).
    """
    if isinstance(messages, (str, bytes, Message)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of Message, got {type(messages).__name__}.")
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one message.")
    result = []
    roles = fmt.roles
    for index, message in enumerate(messages):
        if type(message) is not Message:
            message = _as_message(index, message)
        if message.role not in roles:
            raise ValueError(
                f"message {index} has role {message.role!r}, which the {fmt.name} chat format does not support; "
                f"supported roles: {', '.join(sorted(roles))}."
            )
        text = message._text
        if not text.strip():
            if message.contains_media:
                raise ValueError(_media_error(index, message))
            open_turn = not message.eot or not add_end_tokens
            if not (index == len(messages) - 1 and message.role == "assistant" and open_turn):
                raise ValueError(
                    f"message {index} ({message.role}) has empty content {text!r}; drop the message or give it text "
                    "(an empty assistant turn is only allowed last, with eot=False or add_end_tokens=False, as a "
                    "generation prompt)."
                )
        elif message._parts is not None and message.contains_media:
            raise ValueError(_media_error(index, message))
        result.append(message)
    return result


def _as_message(index: int, message: Any) -> Message:
    if isinstance(message, dict):
        missing = [key for key in ("role", "content") if key not in message]
        if missing:
            raise ValueError(f"message {index} has no {' or '.join(map(repr, missing))} key: {message!r:.80}")
        return Message.from_dict(message)
    if not isinstance(message, Message):
        raise TypeError(f"message {index} must be a Message (or a dict), got {type(message).__name__}.")
    return message


def _media_error(index: int, message: Message) -> str:
    kinds = sorted({part["type"] for part in message.content if part["type"] != "text"})
    return (
        f"message {index} ({message.role}) holds {', '.join(kinds)} content; tune's tokenizers are text-only, so "
        "give the message text content only."
    )


def validate_messages(messages: list[Message]) -> None:
    """Checks that ``messages`` is a back-and-forth conversation, as torchtune's function of this name does.

    Raises:
        ValueError: if there are fewer than two messages, a system message is not first, two user messages
            follow each other, or an assistant message does not follow a user message.
    """
    if len(messages) < 2:
        raise ValueError(
            f"A conversation needs at least 2 messages (a user and an assistant turn), got {len(messages)}."
        )
    previous = "assistant"
    for index, message in enumerate(messages):
        if message.role == "system" and index > 0:
            raise ValueError(f"message {index} is a system message; a system message can only come first.")
        if message.role == "user" and previous == "user":
            raise ValueError(f"messages {index - 1} and {index} are both user messages; expected an answer between.")
        if message.role == "assistant" and previous != "user":
            raise ValueError(f"message {index} is an assistant message that does not follow a user message.")
        previous = message.role


# Segments of template text (role markers, special tokens, separators: never message content), made once each: a
# conversation has a dozen of them and building a Segment costs several times a dict look-up.
_TEMPLATE_SEGMENTS: dict[tuple[str, bool, bool], Segment] = {}
_MAX_TEMPLATE_SEGMENTS = 4096


def _template_segment(text: str, trainable: bool, special: bool) -> Segment:
    key = (text, trainable, special)
    segment = _TEMPLATE_SEGMENTS.get(key)
    if segment is None:
        if len(_TEMPLATE_SEGMENTS) >= _MAX_TEMPLATE_SEGMENTS:
            _TEMPLATE_SEGMENTS.clear()
        segment = _TEMPLATE_SEGMENTS[key] = Segment(text, trainable, special)
    return segment


_TEMPLATE_GROUPS: dict[tuple[tuple[tuple[str, bool], ...], bool], tuple[Segment, ...]] = {}


def _template_segments(pieces: tuple[tuple[str, bool], ...], trainable: bool) -> tuple[Segment, ...]:
    """:func:`_template_segment` of several ``(text, special)`` pieces with one flag, empty texts left out."""
    key = (pieces, trainable)
    segments = _TEMPLATE_GROUPS.get(key)
    if segments is None:
        if len(_TEMPLATE_GROUPS) >= _MAX_TEMPLATE_SEGMENTS:
            _TEMPLATE_GROUPS.clear()
        segments = _TEMPLATE_GROUPS[key] = tuple(Segment(t, trainable, special) for t, special in pieces if t)
    return segments


class _Builder:
    """Collects segments and decides which are trained (see the module docstring for the rule)."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.segments: list[Segment] = []
        self._trained = [not m.masked for m in messages]

    def _add(self, text: str, trainable: bool, special: bool) -> None:
        if text:
            self.segments.append(_template_segment(text, trainable, special))

    def fixed(self, text: str, special: bool = False) -> None:
        """Template text that belongs to no message: never trained."""
        self._add(text, False, special)

    def header(self, index: int, text: str, special: bool = False) -> None:
        """Lead-in of message ``index``: trained only if it and the message before it are trained."""
        self._add(text, self._trained[index] and index > 0 and self._trained[index - 1], special)

    def headers(self, index: int, pieces: tuple[tuple[str, bool], ...]) -> None:
        """:meth:`header` of several ``(text, special)`` pieces at once (a tuple that is the same object for every
        turn with the same role, so that its segments are made once)."""
        trained = self._trained[index] and index > 0 and self._trained[index - 1]
        self.segments.extend(_template_segments(pieces, trained))

    def content(self, index: int, text: str, special: bool = False) -> None:
        """Message text (or, with ``special``, a special token standing for the message's end)."""
        if special:
            self._add(text, self._trained[index], True)
        elif text:
            self.segments.append(Segment(text, self._trained[index]))

    def end(self, index: int, text: str, special: bool = False) -> None:
        """The end-of-turn marker: trained together with the content it closes."""
        self._add(text, self._trained[index], special)

    def separator(self, index: int, text: str) -> None:
        """Text between message ``index`` and the next one: part of the next message's lead-in."""
        following = index + 1 < len(self._trained) and self._trained[index + 1]
        self._add(text, self._trained[index] and following, False)


def _split_system(messages: Sequence[Message], fmt_name: str) -> tuple[Message | None, list[tuple[int, Message]]]:
    """For formats that fold the system prompt into the first user turn: the system message and the rest."""
    system = messages[0] if messages[0].role == "system" else None
    rest = list(enumerate(messages))[1 if system else 0 :]
    for index, message in rest:
        if message.role == "system":
            raise ValueError(
                f"message {index} is a system message; the {fmt_name} chat format takes one system message, first."
            )
    if system is not None and (not rest or rest[0][1].role != "user"):
        raise ValueError(
            f"the {fmt_name} chat format folds the system prompt into the first user turn, so a user message must "
            "follow the system message."
        )
    return system, rest


def _open_end(messages: Sequence[Message], index: int, add_end_tokens: bool) -> bool:
    """Whether message ``index`` gets its end-of-turn tokens."""
    last = index == len(messages) - 1
    return messages[index].eot and not (last and not add_end_tokens and messages[index].role == "assistant")


def _needs_generation_prompt(messages: Sequence[Message], add_end_tokens: bool) -> bool:
    return not add_end_tokens and messages[-1].role != "assistant"


class PlainChatFormat:
    """No chat template: the messages' text one after another, BOS opening each turn, EOS closing each assistant
    turn. This is torchtune's layout for a SentencePiece tokenizer built with ``prompt_template=None``, used when
    the text already carries its prompt (Alpaca's ``### Instruction:`` ... ``### Response:``).

    Each text part of each message is encoded separately with its trailing spaces removed (a prompt template such
    as torchtune's ``Llama2ChatTemplate`` adds its tags as parts of their own). The parts of a message that
    continues a turn (after a user message, before its answer) are encoded as they read in the middle of a text,
    with no dummy-prefix space, unless the message before it ended in a space. Every token, BOS and EOS included,
    carries its message's ``masked`` flag, so with ``train_on_input=True`` the whole sequence is trained.

    Args:
        bos_token (str): the BOS piece.
        eos_token (str): the EOS piece.
    """

    name = "plain"
    roles = frozenset({"system", "user", "assistant", "tool", "ipython"})
    # torchtune's SentencePiece tokenizers: the EOS that replaces a cut sample's last token keeps that token's mask
    # (see ChatTokenizer.truncation_keeps_mask)
    truncation_keeps_mask = True

    def __init__(self, bos_token: str = "<s>", eos_token: str = "</s>") -> None:
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        segments = []
        start_of_turn, previous_ends_with_space = True, False
        for i, m in enumerate(messages):
            trained = not m.masked
            if start_of_turn:
                segments.append(Segment(self.bos_token, trained, special=True))
            trim = not start_of_turn and not previous_ends_with_space
            texts = [part["content"] for part in m.content if part["type"] == "text"] if m._parts else [m._text]
            for text in texts:
                if text.rstrip(" "):
                    segments.append(Segment(text.rstrip(" "), trained, separate=True, trim_leading_whitespace=trim))
            previous_ends_with_space = bool(texts) and texts[-1].endswith(" ")
            start_of_turn = m.role == "assistant"
            if start_of_turn and _open_end(messages, i, add_end_tokens):
                segments.append(Segment(self.eos_token, trained, special=True))
        return segments


class Llama2ChatFormat:
    """Llama 2 chat: ``<s>[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user} [/INST] {assistant} </s>``.

    Reproduces the chat template of ``meta-llama/Llama-2-7b-chat-hf`` (content is stripped, BOS opens every user
    turn, the system prompt is folded into the first user turn).
    """

    name = "llama2"
    roles = frozenset({"system", "user", "assistant"})

    def __init__(self, bos_token: str = "<s>", eos_token: str = "</s>") -> None:
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        system, rest = _split_system(messages, self.name)
        for position, (i, m) in enumerate(rest):
            if m.role == "user":
                b.header(i, self.bos_token, special=True)
                b.header(i, "[INST] ")
                if position == 0 and system is not None:
                    # the template strips "<<SYS>>...user", so only the user text's end is stripped here
                    b.header(0, "<<SYS>>\n")
                    b.content(0, system._text)
                    b.end(0, "\n<</SYS>>\n\n")
                    b.content(i, m._text.rstrip())
                else:
                    b.content(i, m._text.strip())
                b.end(i, " [/INST]")
            else:
                b.header(i, " ")
                b.content(i, m._text.strip())
                if _open_end(messages, i, add_end_tokens):
                    b.end(i, " ")
                    b.end(i, self.eos_token, special=True)
        return b.segments


class MistralChatFormat:
    """Mistral instruct: ``<s> [INST] {system}\\n\\n{user} [/INST] {assistant}</s>``.

    Reproduces the chat template of ``mistralai/Mixtral-8x7B-Instruct-v0.1`` (also used by
    ``Mistral-7B-Instruct-v0.2``): content is not stripped, the system prompt is folded into the first user turn.
    """

    name = "mistral"
    roles = frozenset({"system", "user", "assistant"})

    def __init__(self, bos_token: str = "<s>", eos_token: str = "</s>") -> None:
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        system, rest = _split_system(messages, self.name)
        b.fixed(self.bos_token, special=True)
        for position, (i, m) in enumerate(rest):
            if m.role == "user":
                b.header(i, " [INST] ")
                if position == 0 and system is not None:
                    b.content(0, system._text)
                    b.end(0, "\n\n")
                b.content(i, m._text)
                b.end(i, " [/INST]")
            else:
                b.header(i, " ")
                b.content(i, m._text)
                if _open_end(messages, i, add_end_tokens):
                    b.end(i, self.eos_token, special=True)
        return b.segments


class Llama3ChatFormat:
    """Llama 3 chat: ``<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``.

    Reproduces the chat template of ``meta-llama/Meta-Llama-3-8B-Instruct`` (content stripped). Tool results use
    the ``ipython`` role, as Llama 3.1 names it. The "Cutting Knowledge Date" preamble that the Llama 3.1+
    templates add to every conversation is not added (torchtune never added it either); pass it as a system
    message if you want it.
    """

    name = "llama3"
    roles = frozenset({"system", "user", "assistant", "tool", "ipython"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        b.fixed("<|begin_of_text|>", special=True)
        for i, m in enumerate(messages):
            b.headers(i, _llama3_header("ipython" if m.role == "tool" else m.role))
            if m.ipython:  # an assistant's tool call, as torchtune's Llama 3 tokenizer opens it
                b.content(i, "<|python_tag|>", special=True)
            b.content(i, m._text.strip())
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "<|eot_id|>", special=True)
        if _needs_generation_prompt(messages, add_end_tokens):
            for text, special in _llama3_header("assistant"):
                b.fixed(text, special)
        return b.segments


@functools.lru_cache(maxsize=64)
def _llama3_header(role: str) -> tuple[tuple[str, bool], ...]:
    """``(text, special)`` pieces of a Llama 3 turn header."""
    return (("<|start_header_id|>", True), (role, False), ("<|end_header_id|>", True), ("\n\n", False))


QWEN2_5_DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class _ChatML:
    """Shared pieces of the ChatML layout ``<|im_start|>{role}\\n{content}<|im_end|>\\n``."""

    name = "chatml"
    roles = frozenset({"system", "user", "assistant", "tool"})

    def _turn(self, b: _Builder, i: int, role: str, content: str, end: bool) -> None:
        b.header(i, "<|im_start|>", special=True)
        b.header(i, role + "\n")
        b.content(i, content)
        if end:
            b.end(i, "<|im_end|>", special=True)
            b.separator(i, "\n")

    def _tool(self, b: _Builder, messages: Sequence[Message], i: int, end: bool) -> None:
        # consecutive tool results share one user turn, each wrapped in <tool_response> tags
        if i == 0 or messages[i - 1].role != "tool":
            b.header(i, "<|im_start|>", special=True)
            b.header(i, "user")
        b.header(i, "\n<tool_response>\n")
        b.content(i, messages[i]._text)
        b.end(i, "\n</tool_response>")
        if end and (i == len(messages) - 1 or messages[i + 1].role != "tool"):
            b.end(i, "<|im_end|>", special=True)
            b.separator(i, "\n")

    @staticmethod
    def _generation_prompt(b: _Builder) -> None:
        b.fixed("<|im_start|>", special=True)
        b.fixed("assistant\n")


class Qwen2_5ChatFormat(_ChatML):
    """Qwen 2.5 ChatML. Reproduces the chat template of ``Qwen/Qwen2.5-7B-Instruct`` without tools: when the
    conversation has no system message first, the template's default system prompt
    (:data:`QWEN2_5_DEFAULT_SYSTEM_PROMPT`) is inserted (never trained); content is not stripped.

    Args:
        default_system_prompt (str | None): the system prompt inserted when the conversation has none; None
            inserts nothing (differs from the real template).
    """

    name = "qwen2_5"

    def __init__(self, default_system_prompt: str | None = QWEN2_5_DEFAULT_SYSTEM_PROMPT) -> None:
        self.default_system_prompt = default_system_prompt

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        if messages[0].role != "system" and self.default_system_prompt is not None:
            b.fixed("<|im_start|>", special=True)
            b.fixed("system\n" + self.default_system_prompt)
            b.fixed("<|im_end|>", special=True)
            b.fixed("\n")
        for i, m in enumerate(messages):
            end = _open_end(messages, i, add_end_tokens)
            if m.role == "tool":
                self._tool(b, messages, i, end)
            else:
                self._turn(b, i, m.role, m._text, end)
        if _needs_generation_prompt(messages, add_end_tokens):
            self._generation_prompt(b)
        return b.segments


QWEN2_DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


class Qwen2ChatFormat(Qwen2_5ChatFormat):
    """Qwen2 ChatML. Reproduces the chat template of ``Qwen/Qwen2-7B-Instruct``: Qwen 2.5's layout, with Qwen2's
    default system prompt (:data:`QWEN2_DEFAULT_SYSTEM_PROMPT`) inserted when the conversation has none.

    Args:
        default_system_prompt (str | None): the system prompt inserted when the conversation has none; None
            inserts nothing (differs from the real template).
    """

    name = "qwen2"

    def __init__(self, default_system_prompt: str | None = QWEN2_DEFAULT_SYSTEM_PROMPT) -> None:
        super().__init__(default_system_prompt)


def _is_tool_response(text: str) -> bool:
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


class Qwen3ChatFormat(_ChatML):
    """Qwen 3 ChatML with thinking. Reproduces the chat template of ``Qwen/Qwen3-8B`` without tools.

    For assistant turns the template splits ``<think>...</think>`` reasoning out of the content: turns before the
    last user query lose their reasoning; turns after it (and the final turn) are written as
    ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}``. A final assistant turn without reasoning therefore gets an
    empty ``<think>\\n\\n</think>\\n\\n`` block, as the template writes it; that empty block is treated like a header
    (the prompt Qwen 3 uses with ``enable_thinking=False``), so it is not trained by default. Reasoning that is
    present is trained as part of the content.

    Args:
        enable_thinking (bool): with False, a generation prompt ends in the empty think block, as the template's
            ``enable_thinking=False`` does. Default True.
    """

    name = "qwen3"

    def __init__(self, enable_thinking: bool = True) -> None:
        self.enable_thinking = enable_thinking

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        last_query = len(messages) - 1
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].role == "user" and not _is_tool_response(messages[i]._text):
                last_query = i
                break
        for i, m in enumerate(messages):
            end = _open_end(messages, i, add_end_tokens)
            if m.role == "tool":
                self._tool(b, messages, i, end)
            elif m.role == "assistant":
                self._assistant(b, i, m._text, end, after_query=i > last_query, last=i == len(messages) - 1)
            else:
                self._turn(b, i, m.role, m._text, end)
        if _needs_generation_prompt(messages, add_end_tokens):
            self._generation_prompt(b)
            if not self.enable_thinking:
                b.fixed("<think>\n\n</think>\n\n")
        return b.segments

    def _assistant(self, b: _Builder, i: int, content: str, end: bool, *, after_query: bool, last: bool) -> None:
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        b.header(i, "<|im_start|>", special=True)
        b.header(i, "assistant\n")
        if after_query and (last or reasoning):
            block = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
            (b.content if reasoning.strip("\n") else b.header)(i, block)
            content = content.lstrip("\n")
        b.content(i, content)
        if end:
            b.end(i, "<|im_end|>", special=True)
            b.separator(i, "\n")


class Gemma2ChatFormat:
    """Gemma 2: ``<bos><start_of_turn>user\\n{content}<end_of_turn>\\n<start_of_turn>model\\n...``.

    Reproduces the chat template of ``google/gemma-2-2b-it`` (content stripped, assistant named ``model``). That
    template rejects a system message; here a system message is folded into the first user turn followed by a
    blank line, as the ``google/gemma-3-1b-it`` template does.
    """

    name = "gemma2"
    roles = frozenset({"system", "user", "assistant"})

    def __init__(self, bos_token: str = "<bos>") -> None:
        self.bos_token = bos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        system, rest = _split_system(messages, self.name)
        b.fixed(self.bos_token, special=True)
        for position, (i, m) in enumerate(rest):
            b.header(i, "<start_of_turn>", special=True)
            b.header(i, ("model" if m.role == "assistant" else m.role) + "\n")
            if position == 0 and system is not None:
                b.content(0, system._text)
                b.end(0, "\n\n")
            b.content(i, m._text.strip())
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "<end_of_turn>", special=True)
                b.separator(i, "\n")
        if _needs_generation_prompt(messages, add_end_tokens):
            b.fixed("<start_of_turn>", special=True)
            b.fixed("model\n")
        return b.segments


class GemmaChatFormat(Gemma2ChatFormat):
    """Gemma: the chat template of ``google/gemma-7b-it``, which is Gemma 2's (:class:`Gemma2ChatFormat`), under
    the first generation's name."""

    name = "gemma"


class Phi3ChatFormat:
    """Phi-3: ``<|system|>\\n{content}<|end|>\\n<|user|>\\n...<|assistant|>\\n...<|end|>\\n<|endoftext|>``.

    Reproduces the chat template of ``microsoft/Phi-3-mini-4k-instruct``: no BOS, content not stripped, and a
    closing ``<|endoftext|>`` after the last turn, which is trained when the last turn is (it is what the model
    emits after its final ``<|end|>``).
    """

    name = "phi3"
    roles = frozenset({"system", "user", "assistant"})

    def __init__(self, eos_token: str = "<|endoftext|>") -> None:
        self.eos_token = eos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        for i, m in enumerate(messages):
            b.header(i, f"<|{m.role}|>", special=True)
            b.header(i, "\n")
            b.content(i, m._text)
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "<|end|>", special=True)
                b.separator(i, "\n")
        if _needs_generation_prompt(messages, add_end_tokens):
            b.fixed("<|assistant|>", special=True)
            b.fixed("\n")
        elif add_end_tokens and messages[-1].eot:
            b.content(len(messages) - 1, self.eos_token, special=True)
        return b.segments


class Phi4ChatFormat:
    """Phi-4: ``<|im_start|>system<|im_sep|>{content}<|im_end|><|im_start|>user<|im_sep|>...<|im_end|>``.

    Reproduces the chat template of ``microsoft/phi-4``: no BOS, no newline between turns, content not stripped,
    and ``<|im_start|>assistant<|im_sep|>`` as the generation prompt.
    """

    name = "phi4"
    roles = frozenset({"system", "user", "assistant"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        b = _Builder(messages)
        for i, m in enumerate(messages):
            b.header(i, "<|im_start|>", special=True)
            b.header(i, m.role)
            b.header(i, "<|im_sep|>", special=True)
            b.content(i, m._text)
            if _open_end(messages, i, add_end_tokens):
                b.end(i, "<|im_end|>", special=True)
        if _needs_generation_prompt(messages, add_end_tokens):
            b.fixed("<|im_start|>", special=True)
            b.fixed("assistant")
            b.fixed("<|im_sep|>", special=True)
        return b.segments


class TorchtuneLlama3Format:
    """torchtune's Llama 3 layout, token for token: ``<|begin_of_text|>``, then per message
    ``<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>`` (``<|eom_id|>`` for a message with
    ``eot=False``, ``<|python_tag|>`` opening a tool call), then ``<|end_of_text|>``. The role, the ``"\n\n"`` and
    each text part (stripped) are encoded on their own. A message's header, text and end token all carry its mask,
    so a trained answer trains its header; BOS and the final EOS are never trained. With ``add_end_tokens=False``
    the last message gets no end token and no EOS follows (no generation prompt is added).

    :func:`~tune.models.llama3.llama3_tokenizer` uses it by default with a ``tokenizer.model``, as torchtune does;
    :class:`~tune.data.Llama3ChatFormat` is the layout of ``meta-llama/Meta-Llama-3-8B-Instruct``'s chat template.
    """

    name = "llama3"
    roles = frozenset({"system", "user", "assistant", "tool", "ipython"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        segments = [Segment("<|begin_of_text|>", False, special=True)]
        for i, m in enumerate(messages):
            trained = not m.masked
            segments += [
                Segment("<|start_header_id|>", trained, special=True),
                Segment(m.role.strip(), trained, separate=True),
                Segment("<|end_header_id|>", trained, special=True),
                Segment("\n\n", trained, separate=True),
            ]
            if m.ipython:
                segments.append(Segment("<|python_tag|>", trained, special=True))
            for part in m.content:
                if part["type"] == "text" and part["content"].strip():
                    segments.append(Segment(part["content"].strip(), trained, separate=True))
            if add_end_tokens or i < len(messages) - 1:
                segments.append(Segment("<|eot_id|>" if m.eot else "<|eom_id|>", trained, special=True))
        if add_end_tokens:
            segments.append(Segment("<|end_of_text|>", False, special=True))
        return segments


def _text_parts(message: Message) -> list[str]:
    """The message's text parts, each as given (torchtune encodes each part on its own)."""
    if message._parts is None:
        return [message._text]
    return [part["content"] for part in message.content if part["type"] == "text"]


_TOOL_ROLES = frozenset({"tool", "ipython"})


class TorchtuneQwen2Format:
    """torchtune's Qwen2 / Qwen 2.5 layout, token for token: per message
    ``<|im_start|>{role}\n{text}<|im_end|>\n``, except that the last message, when it is an answer, stops after its
    text; then ``<|im_end|>`` (torchtune's EOS for Qwen). Every token of a message carries its mask, the final
    ``<|im_end|>`` the last message's, so a trained answer trains its ``<|im_start|>assistant\n``. No default
    system prompt is inserted. A tool result (role ``tool``, torchtune's ``ipython``) has no turn markers of its
    own; with ``tool_responses`` (Qwen 2.5) consecutive results share one user turn, each in
    ``<tool_response>`` tags, and an answer with ``ipython=True`` is wrapped in ``<tool_call>`` tags. With
    ``add_end_tokens=False`` no final ``<|im_end|>`` is added (no generation prompt either).

    torchtune encodes the role line and each text part on its own; here the text between two special tokens is
    encoded at once, which gives the same tokens unless a message's text starts with whitespace holding a line
    break (the ``"\n"`` ending the role line then merges with it) or a message has several text parts.

    :func:`~tune.models.qwen2.qwen2_tokenizer` and :func:`~tune.models.qwen2_5.qwen2_5_tokenizer` use it by default
    with torchtune's ``vocab.json`` + ``merges.txt``; :class:`Qwen2ChatFormat` and :class:`Qwen2_5ChatFormat` are
    the Hugging Face chat templates.

    Args:
        tool_responses (bool): Qwen 2.5's tool layout (True) or Qwen2's (False). Default False.
    """

    name = "qwen2"
    roles = frozenset({"system", "user", "assistant", "tool", "ipython"})

    def __init__(self, tool_responses: bool = False) -> None:
        self.tool_responses = tool_responses

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        segments: list[Segment] = []
        last = len(messages) - 1
        for i, m in enumerate(messages):
            pieces: list[tuple[str, bool]] = []
            tool = m.role in _TOOL_ROLES
            first_tool = tool and (i == 0 or messages[i - 1].role not in _TOOL_ROLES)
            last_tool = tool and (i == last or messages[i + 1].role not in _TOOL_ROLES)
            call = self.tool_responses and m.role == "assistant" and m.ipython
            if not tool:
                pieces += [("<|im_start|>", True), (m.role + "\n", False)]
                if call:
                    pieces += [("<tool_call>", True), ("\n", False)]
            elif self.tool_responses and first_tool:
                pieces += [("<|im_start|>", True), ("user\n<tool_response>\n", False)]
            elif self.tool_responses:
                pieces.append(("\n<tool_response>\n", False))
            pieces += [(text, False) for text in _text_parts(m)]
            if tool and self.tool_responses:
                pieces.append(("\n</tool_response>", False))
            if call:
                pieces += [("\n", False), ("</tool_call>", True)]
            if (not tool and (m.role != "assistant" or i != last)) or (last_tool and self.tool_responses):
                pieces += [("<|im_end|>", True), ("\n", False)]
            trained = not m.masked
            segments += [Segment(text, trained, special) for text, special in pieces if text]
        if add_end_tokens:
            segments.append(Segment("<|im_end|>", not messages[-1].masked, special=True))
        return segments


class TorchtunePhi3Format:
    """torchtune's Phi-3 mini layout, token for token: ``<s>``, then per message ``<|{role}|>`` and ``"\\n"``, each
    text part with its trailing spaces removed and encoded as it reads in the middle of a text (no dummy-prefix
    space), ``<|end|>`` and ``"\\n"``. Every token, ``<s>`` included, carries its message's mask. No
    ``<|endoftext|>`` follows an answer: torchtune's ``tokenize_messages`` adds it (and a ``<s>`` after it) only
    when asked to, and its datasets do not ask. ``add_end_tokens`` changes nothing.

    :func:`~tune.models.phi3.phi3_mini_tokenizer` uses it by default with a ``tokenizer.model``;
    :class:`Phi3ChatFormat` is the chat template of ``microsoft/Phi-3-mini-4k-instruct``.

    Args:
        bos_token (str): the BOS piece. Default "<s>".
    """

    name = "phi3"
    roles = frozenset({"system", "user", "assistant"})

    def __init__(self, bos_token: str = "<s>") -> None:
        self.bos_token = bos_token

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        segments = [Segment(self.bos_token, not messages[0].masked, special=True)]
        for m in messages:
            trained = not m.masked
            segments += [Segment(f"<|{m.role}|>", trained, special=True), Segment("\n", trained, separate=True)]
            for text in _text_parts(m):
                if text.rstrip(" "):
                    segments.append(Segment(text.rstrip(" "), trained, separate=True, trim_leading_whitespace=True))
            segments += [Segment("<|end|>", trained, special=True), Segment("\n", trained, separate=True)]
        return segments


class TorchtunePhi4Format:
    """torchtune's Phi-4 layout, token for token: per message ``<|im_start|>{role}<|im_sep|>{text}`` with the
    text parts' trailing spaces removed, then ``<|im_end|>`` after every message but an answer (torchtune's
    ``tokenize_messages`` adds none there by default, and its datasets use that default). No BOS or EOS; every
    token carries its message's mask. ``add_end_tokens`` changes nothing. The text parts of one message are encoded
    together (torchtune encodes them one at a time; the same tokens for a message of one part).

    :func:`~tune.models.phi4.phi4_tokenizer` uses it by default with torchtune's ``vocab.json`` + ``merges.txt``
    (and torchtune's text split, ``TORCHTUNE_PHI4_PATTERN``); :class:`Phi4ChatFormat` is the chat template of
    ``microsoft/phi-4``.
    """

    name = "phi4"
    roles = frozenset({"system", "user", "assistant"})

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        segments: list[Segment] = []
        for m in messages:
            trained = not m.masked
            segments += [
                Segment("<|im_start|>", trained, special=True),
                Segment(m.role, trained),
                Segment("<|im_sep|>", trained, special=True),
            ]
            segments += [Segment(text.rstrip(" "), trained) for text in _text_parts(m) if text.rstrip(" ")]
            if m.role != "assistant":
                segments.append(Segment("<|im_end|>", trained, special=True))
        return segments


def named_chat_format(prompt_template: object, formats: Sequence[type]) -> Any:
    """The chat format among ``formats`` that a tokenizer's ``prompt_template`` names: by its dotted name
    (``"tune.data.Qwen2ChatFormat"``), as the class, or as an instance (kept with its settings). None when it
    names none of them: no template, or a prompt template to apply before the family's torchtune layout."""
    for cls in formats:
        if prompt_template is cls or (isinstance(prompt_template, str) and prompt_template == _dotted(cls)):
            return cls()
        if type(prompt_template) is cls:
            return prompt_template
    return None


def _dotted(cls: type) -> str:
    return f"tune.data.{cls.__name__}"
