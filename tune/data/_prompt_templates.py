"""Prompt templates: text put around each message's content according to its role, before the chat format.

A template maps a role to a ``(prepend, append)`` pair of strings. The added text becomes part of the message, so
it is trained exactly when the message is: tags around a user turn get no loss under the default masking, tags
around an assistant turn do. A tokenizer applies its ``prompt_template`` to every conversation before laying it
out with its chat format (see ``tune.data._tokenizers._chat``).
"""

from collections.abc import Mapping
from typing import Protocol

from tune.data._messages import Message, Role

_GRAMMAR = {"user": ("Correct this to standard English: ", "\n---\nCorrected: ")}
_SUMMARIZE = {"user": ("Summarize this dialogue:\n", "\n---\nSummary:\n")}
_QUESTION_ANSWER = {"user": ("Question: ", "\n\nAnswer: ")}


class PromptTemplateInterface(Protocol):
    """What a prompt template offers: a ``template`` of role -> ``(prepend, append)`` and a call that returns the
    conversation with that text added."""

    template: dict[Role, tuple[str, str]]

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages with the template's text around each message's content.

        Args:
            messages (list[Message]): one conversation.
            inference (bool): whether the conversation is a prompt for generation.

        Returns:
            list[Message]: the templated conversation.
        """
        ...


def _wrapped(message: Message, prepend: str, append: str) -> Message:
    """A copy of ``message`` with a text part before and after its content (empty strings add nothing)."""
    parts = message.content
    if prepend:
        parts = [{"type": "text", "content": prepend}, *parts]
    if append:
        parts = [*parts, {"type": "text", "content": append}]
    return Message(message.role, parts, masked=message.masked, ipython=message.ipython, eot=message.eot)


class PromptTemplate:
    """A prompt template from a mapping of role to ``(prepend, append)`` text.

    For example ``PromptTemplate({"user": ("Question: ", "\\n\\nAnswer: ")})`` turns the user turn
    ``"Why is the sky blue?"`` into ``"Question: Why is the sky blue?\\n\\nAnswer: "``; other roles are left as
    they are. Text added to an assistant turn is trained on with it; to put text right before the answer without
    training on it, append it to the user turn instead.

    Args:
        template (Mapping[str, tuple[str, str]]): role -> ``(prepend, append)``.

    Raises:
        ValueError: if a value is not a pair of strings.
    """

    def __init__(self, template: Mapping[Role, tuple[str, str]]) -> None:
        for role, tags in template.items():
            if not (isinstance(tags, (tuple, list)) and len(tags) == 2 and all(isinstance(t, str) for t in tags)):
                raise ValueError(f"template[{role!r}] must be a (prepend, append) pair of strings, got {tags!r}.")
        self.template = {role: tuple(tags) for role, tags in template.items()}

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages with the template's text around the content of each role it names.

        Args:
            messages (list[Message]): one conversation.
            inference (bool): unused; accepted for the :class:`PromptTemplateInterface` call.

        Returns:
            list[Message]: the templated conversation (the input messages are not changed).
        """
        template = self.template
        return [_wrapped(m, *template[m.role]) if m.role in template else m for m in messages]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.template!r})"


class ChatMLTemplate:
    """OpenAI's Chat Markup Language written as text: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` for system,
    user and assistant turns; tool results (``ipython``/``tool``) are left as they are. A final assistant turn
    with no text gets only its opening tag, so the conversation ends where the model's answer starts.

    For a tokenizer whose vocabulary has ``<|im_start|>``/``<|im_end|>`` as special tokens, prefer the family's
    own chat format (Qwen's), which encodes them as special tokens.
    """

    template = {
        "system": ("<|im_start|>system\n", "<|im_end|>\n"),
        "user": ("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
        "ipython": ("", ""),
        "tool": ("", ""),
    }

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages wrapped in ChatML tags (see the class docstring).

        Args:
            messages (list[Message]): one conversation.
            inference (bool): unused; accepted for the :class:`PromptTemplateInterface` call.

        Returns:
            list[Message]: the templated conversation.
        """
        last = len(messages) - 1
        out = []
        for index, m in enumerate(messages):
            prepend, append = self.template[m.role]
            if index == last and m.role == "assistant" and not m.text_content:
                append = ""
            out.append(_wrapped(m, prepend, append))
        return out


class GrammarErrorCorrectionTemplate(PromptTemplate):
    """``Correct this to standard English: {user}\\n---\\nCorrected: {assistant}``.

    Args:
        template (Mapping[str, tuple[str, str]]): the role -> ``(prepend, append)`` text; defaults to the above.
    """

    def __init__(self, *, template: Mapping[Role, tuple[str, str]] = _GRAMMAR) -> None:
        super().__init__(template)


class SummarizeTemplate(PromptTemplate):
    """``Summarize this dialogue:\\n{user}\\n---\\nSummary:\\n{assistant}``.

    Args:
        template (Mapping[str, tuple[str, str]]): the role -> ``(prepend, append)`` text; defaults to the above.
    """

    def __init__(self, *, template: Mapping[Role, tuple[str, str]] = _SUMMARIZE) -> None:
        super().__init__(template)


class QuestionAnswerTemplate(PromptTemplate):
    """``Question: {user}\\n\\nAnswer: {assistant}``.

    Args:
        template (Mapping[str, tuple[str, str]]): the role -> ``(prepend, append)`` text; defaults to the above.
    """

    def __init__(self, *, template: Mapping[Role, tuple[str, str]] = _QUESTION_ANSWER) -> None:
        super().__init__(template)


# torchtune's chat templates of two families, at their torchtune paths (tune.models.llama2.Llama2ChatTemplate,
# tune.models.mistral.MistralChatTemplate): text parts around each message, laid out as torchtune lays them out


def _text(content: str) -> dict[str, str]:
    return {"type": "text", "content": content}


class Llama2ChatTemplate:
    """torchtune's Llama 2 chat template, with torchtune's tokens.

    :func:`~tune.models.llama2.llama2_tokenizer`'s default, as in torchtune. It writes the tags as text parts of the
    messages: each user turn becomes ``"[INST] "``, then (when a system message came before it) ``"<<SYS>>\\n"``,
    the system text and ``"\\n<</SYS>>\\n\\n"``, then the user text and ``" [/INST] "``; the system message itself is
    dropped and its text repeats in every later user turn; answers are unchanged. The tokenizer then encodes each
    part on its own (trailing spaces removed) between BOS and EOS (:class:`~tune.data.PlainChatFormat`), so the
    text is not stripped and answers end without a space before ``</s>``: torchtune's tokens for a torchtune config.

    The layout of ``meta-llama/Llama-2-7b-chat-hf``'s chat template (stripped text, the system prompt in the first
    user turn only, ``" </s>"``) is tune's :class:`~tune.data.Llama2ChatFormat`: give
    ``prompt_template: tune.data.Llama2ChatFormat`` to the tokenizer for it.
    """

    template = {
        "system": ("<<SYS>>\n", "\n<</SYS>>\n\n"),
        "user": ("[INST] ", " [/INST] "),
        "assistant": ("", ""),
        "ipython": ("", ""),
    }

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages laid out as in the class docstring.

        Args:
            messages (list[Message]): one conversation.
            inference (bool): unused; accepted for the prompt-template call.

        Returns:
            list[Message]: the templated conversation (the input messages are not changed).
        """
        system: list[dict] = []
        out = []
        for message in messages:
            if message.role == "system":
                before, after = self.template["system"]
                system = [_text(before), *message.content, _text(after)]
                continue
            content = message.content
            if message.role == "user":
                before, after = self.template["user"]
                content = [_text(before), *system, *content, _text(after)]
            out.append(Message(message.role, content, masked=message.masked, ipython=message.ipython, eot=message.eot))
        return out

    def __repr__(self) -> str:
        return "Llama2ChatTemplate()"


class MistralChatTemplate:
    """torchtune's Mistral chat template, with torchtune's tokens.

    :func:`~tune.models.mistral.mistral_tokenizer`'s default, as in torchtune. It wraps each message's text in its
    role's tags, as text parts of their own: ``"[INST] "`` and ``" [/INST] "`` around a user turn, nothing around
    an answer. The tokenizer then encodes each part on its own (trailing spaces removed) between BOS and EOS
    (:class:`~tune.data.PlainChatFormat`), so ``[INST]`` is text even with a v0.3 vocabulary that has it as a
    control piece: torchtune's tokens for a torchtune config. A system message is refused, as torchtune does.

    The layouts of ``mistralai/Mistral-7B-Instruct-v0.2`` / ``-v0.3``'s chat templates (stripped answers, a system
    prompt folded into the first user turn, ``[INST]`` as a control token for v0.3) are tune's
    :class:`~tune.data.MistralChatFormat`: give ``prompt_template: tune.data.MistralChatFormat`` to the tokenizer.
    """

    template = {
        "system": ("", ""),
        "user": ("[INST] ", " [/INST] "),
        "assistant": ("", ""),
        "ipython": ("", ""),
    }

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Returns new messages laid out as in the class docstring.

        Args:
            messages (list[Message]): one conversation.
            inference (bool): unused; accepted for the prompt-template call.

        Returns:
            list[Message]: the templated conversation (the input messages are not changed).

        Raises:
            ValueError: for a system message (torchtune's template has no place for one).
        """
        out = []
        for message in messages:
            if message.role == "system":
                raise ValueError(
                    "MistralChatTemplate (torchtune's) does not take a system message; drop it, or use "
                    "prompt_template: tune.data.MistralChatFormat, which folds it into the first user turn."
                )
            before, after = self.template.get(message.role, ("", ""))
            content = [{"type": "text", "content": before}, *message.content, {"type": "text", "content": after}]
            out.append(Message(message.role, content, masked=message.masked, ipython=message.ipython, eot=message.eot))
        return out

    def __repr__(self) -> str:
        return "MistralChatTemplate()"
