"""A model tokenizer: a text tokenizer plus the family's chat format, producing tokens and an exact loss mask."""

import functools
import importlib
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from tune.data._chat_formats import ChatFormat, Segment, check_messages
from tune.data._messages import Message
from tune.data._prompt_templates import PromptTemplate as RoleTemplate
from tune.data._tokenizers._utils import FlatEncoding, truncate

# A template's type as builders annotate it: anything that takes a conversation and returns the templated one
# (tune.data.PromptTemplate and its subclasses are such callables).
PromptTemplate = Callable[[list[Message]], list[Message]]


class TextTokenizer(Protocol):
    """What :class:`ChatTokenizer` needs from a text tokenizer (SentencePiece, tiktoken, tokenizer.json)."""

    vocab_size: int

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_id(self, token: str) -> int: ...

    def encode_segments(self, segments: Sequence[Segment]) -> tuple[list[int], list[bool]]: ...

    def encode_segments_batch(
        self, conversations: Sequence[Sequence[Segment]]
    ) -> list[tuple[list[int], list[bool]]]: ...


def resolve_prompt_template(prompt_template: "PromptTemplate | dict | str | None") -> PromptTemplate | None:
    """The prompt template a tokenizer applies to messages before rendering, from what a builder was given:

    - None: no template;
    - a callable taking and returning a list of Message (a :class:`~tune.data.PromptTemplate`, a function);
    - a dict of role -> ``(prepend, append)``: a :class:`~tune.data.PromptTemplate` of it;
    - a dotted path ``"package.module.Name"``: a template class (or factory) there is instantiated with no
      arguments, as torchtune does (``"tune.data.QuestionAnswerTemplate"``); a function there is used as is.

    Raises:
        ValueError: if a dotted path cannot be imported or does not name a callable, or for any other value.
    """
    if prompt_template is None or callable(prompt_template):
        return prompt_template
    if isinstance(prompt_template, Mapping):
        return RoleTemplate(prompt_template)
    if isinstance(prompt_template, str) and "." in prompt_template:
        module_name, _, attr = prompt_template.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"prompt_template {prompt_template!r} could not be imported: {e}") from e
        if callable(obj):
            return obj() if isinstance(obj, (type, functools.partial)) else obj
    raise ValueError(
        f"prompt_template must be a callable taking and returning a list of Message, a dict of role -> "
        f"(prepend, append) text, or a dotted path to a template class; got {prompt_template!r}."
    )


def select_chat_format(
    prompt_template: "PromptTemplate | str | None",
    chat_template_names: Collection[str],
    chat_format: ChatFormat,
    plain_format: ChatFormat,
) -> tuple[ChatFormat, "PromptTemplate | str | None"]:
    """How a family whose torchtune tokenizer takes a ``prompt_template`` (Llama 2, Mistral, Llama 3) lays out a
    conversation:

    - one of ``chat_template_names`` (tune's Hugging Face-exact chat format by dotted name, e.g.
      ``"tune.data.Llama2ChatFormat"``): ``chat_format``, with no template;
    - None: no template, laid out as torchtune does (``plain_format``: :class:`~tune.data.PlainChatFormat` for the
      SentencePiece families);
    - any other template (torchtune's default ones included): applied to the messages, then ``plain_format``.

    Returns:
        tuple[ChatFormat, PromptTemplate | str | None]: the chat format and the prompt template left to apply.
    """
    if isinstance(prompt_template, str) and prompt_template in chat_template_names:
        return chat_format, None
    return plain_format, prompt_template


class ChatTokenizer:
    """A family's tokenizer (the ``ModelTokenizer`` protocol): encode/decode text, and turn a conversation into
    tokens plus a loss mask that covers exactly the trained turns.

    Family builders (``tune.models.llama3.llama3_tokenizer``, ...) construct this with the right text tokenizer,
    chat format and special ids; use them rather than this class directly.

    Args:
        tokenizer (TextTokenizer): the text tokenizer.
        chat_format (ChatFormat): how conversations are laid out.
        bos_id (int | None): beginning-of-text id (None for families without one, e.g. Qwen).
        eos_id (int): end-of-text id; replaces the last token of a truncated conversation.
        pad_id (int): id collators pad with.
        stop_tokens (Sequence[int]): ids that end generation (end of turn, end of text).
        special_tokens (Mapping[str, int] | None): named special tokens, for reference.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to the messages before the chat format.

    Raises:
        ValueError: for a non-positive ``max_seq_len`` or a bad ``prompt_template``.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        chat_format: ChatFormat,
        *,
        bos_id: int | None,
        eos_id: int,
        pad_id: int,
        stop_tokens: Sequence[int],
        special_tokens: Mapping[str, int] | None = None,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = None,
    ) -> None:
        if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 1):
            raise ValueError(f"max_seq_len must be a positive integer or None, got {max_seq_len!r}.")
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.stop_tokens = list(stop_tokens)
        self.special_tokens = dict(special_tokens or {})
        self.max_seq_len = max_seq_len
        self.prompt_template = resolve_prompt_template(prompt_template)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Encodes plain text (no chat format).

        Args:
            text (str): the text.
            add_bos (bool): prepend BOS (when the family has one).
            add_eos (bool): append EOS.

        Returns:
            list[int]: token ids.
        """
        ids = self.tokenizer.encode(text, add_bos=False, add_eos=False)
        bos = [self.bos_id] if add_bos and self.bos_id is not None else []
        return bos + ids + ([self.eos_id] if add_eos else [])

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decodes ids to text (special tokens dropped unless ``skip_special_tokens`` is False)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def render(self, messages: Sequence[Message], *, add_end_tokens: bool = True) -> list[Segment]:
        """The chat format's segments for ``messages`` (after validation and the prompt template)."""
        messages = check_messages(messages, self.chat_format, add_end_tokens=add_end_tokens)
        if self.prompt_template is not None:
            messages = check_messages(self.prompt_template(messages), self.chat_format, add_end_tokens=add_end_tokens)
        return self.chat_format.render(messages, add_end_tokens=add_end_tokens)

    @property
    def truncation_keeps_mask(self) -> bool:
        """When a conversation is cut to ``max_seq_len``, EOS replaces its last token. False (the default): that EOS
        gets no loss, the text did not end there (torchtune's Llama 3 and Qwen tokenizers do the same). True, for
        torchtune's SentencePiece layout (:class:`~tune.data.PlainChatFormat`: Llama 2, Mistral, Gemma under
        torchtune's names): it keeps the mask of the token it replaces, trained inside an answer, as torchtune's
        tokenizers do. The datasets, which cut samples themselves, follow it too."""
        return getattr(self.chat_format, "truncation_keeps_mask", False)

    def tokenize_messages(
        self, messages: Sequence[Message], *, add_end_tokens: bool = True
    ) -> tuple[list[int], list[bool]]:
        """Tokens of a conversation and its loss mask.

        Args:
            messages (Sequence[Message]): the conversation; ``Message.masked`` says which turns get no loss.
            add_end_tokens (bool): False leaves the conversation open for generation (no end-of-turn after a
                final assistant turn, a generation prompt after a final user turn).

        Returns:
            tuple[list[int], list[bool]]: ``(tokens, mask)`` of equal length; ``mask[i]`` is True where token i
            gets NO loss. When longer than ``max_seq_len`` both are cut, and with ``add_end_tokens`` the last
            token becomes EOS (masked, or keeping the replaced token's mask: ``truncation_keeps_mask``).

        Raises:
            TypeError: if messages is not a list of Message.
            ValueError: for an empty conversation, empty or non-string content (naming the message), or a role
                the family's format does not support.
        """
        return self.tokenize_messages_batch([messages], add_end_tokens=add_end_tokens)[0]

    def tokenize_messages_batch(
        self, conversations: Sequence[Sequence[Message]], *, add_end_tokens: bool = True
    ) -> list[tuple[list[int], list[bool]]]:
        """:meth:`tokenize_messages` of several conversations at once: the text tokenizer encodes all their texts
        in one batch call (multithreaded in the backend), with the same result as one conversation at a time.

        Args:
            conversations (Sequence[Sequence[Message]]): the conversations.
            add_end_tokens (bool): as in :meth:`tokenize_messages`.

        Returns:
            list[tuple[list[int], list[bool]]]: ``(tokens, mask)`` per conversation.

        Raises:
            TypeError: as :meth:`tokenize_messages`.
            ValueError: as :meth:`tokenize_messages` (for the first bad conversation).
        """
        rendered = [self.render(messages, add_end_tokens=add_end_tokens) for messages in conversations]
        results = []
        for tokens, trainable in self.tokenizer.encode_segments_batch(rendered):
            mask = list(map(operator.not_, trainable))
            if self.max_seq_len is not None:
                forced_eos_mask = None if self.truncation_keeps_mask or not add_end_tokens else True
                tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_end_tokens else None)
                mask = truncate(mask, self.max_seq_len, forced_eos_mask)
            results.append((tokens, mask))
        return results

    def tokenize_messages_flat(
        self, conversations: Sequence[Sequence[Message]], *, add_end_tokens: bool = True
    ) -> FlatEncoding:
        """:meth:`tokenize_messages_batch` with the conversations end to end and NOT truncated (the datasets cut
        and count samples themselves): one int32 array of tokens, one byte per token that is 1 where the token
        gets a loss (the opposite of a mask), and each conversation's length. No Python list per conversation.

        Raises:
            TypeError, ValueError: as :meth:`tokenize_messages`.
        """
        rendered = [self.render(messages, add_end_tokens=add_end_tokens) for messages in conversations]
        encode_flat = getattr(self.tokenizer, "encode_segments_flat", None)
        if encode_flat is None:  # a text tokenizer of one's own with only the list API
            return FlatEncoding.join(self.tokenizer.encode_segments_batch(rendered))
        return encode_flat(rendered)

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> dict[str, Any]:
        """Tokenizes ``sample["messages"]``; returns the sample with ``tokens`` and ``mask`` added.

        Args:
            sample (Mapping[str, Any]): holds ``"messages"``.
            inference (bool): leave the conversation open for generation (``add_end_tokens=False``).

        Returns:
            dict[str, Any]: the other keys of ``sample``, plus ``tokens`` and ``mask``.
        """
        out = {k: v for k, v in sample.items() if k != "messages"}
        out["tokens"], out["mask"] = self.tokenize_messages(sample["messages"], add_end_tokens=not inference)
        return out
