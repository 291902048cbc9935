"""Mistral tokenizer: SentencePiece ``tokenizer.model`` with the Mistral ``[INST]`` chat format."""

from tune.data._chat_formats import MistralChatFormat, PlainChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format
from tune.models.mistral._prompt_template import MistralChatTemplate

# The name of the family's chat template, as torchtune configs spell it (``tune.`` or ``torchtune.``): selects
# the chat format below.
MISTRAL_CHAT_TEMPLATE = "tune.models.mistral.MistralChatTemplate"
_CHAT_TEMPLATE_NAMES = frozenset({MISTRAL_CHAT_TEMPLATE, "torchtune.models.mistral.MistralChatTemplate"})


def _chat_template_name(prompt_template: object) -> object:
    """The family's chat template given as an instance or the class, by its dotted name (other values unchanged)."""
    if prompt_template is MistralChatTemplate or isinstance(prompt_template, MistralChatTemplate):
        return MISTRAL_CHAT_TEMPLATE
    return prompt_template


class MistralTokenizer(ChatTokenizer):
    """The Mistral 7B tokenizer (torchtune's class; :func:`mistral_tokenizer` returns one).

    ``[INST]`` and ``[/INST]`` are encoded as text, as in the 32000-piece v0.1/v0.2 vocabulary. The v0.3 vocabulary
    has them as control tokens, which this tokenizer does not use.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): :class:`MistralChatTemplate` (the default; an instance, the
            class or its dotted name, ``tune.`` or ``torchtune.``) selects the ``[INST]`` chat format of
            ``mistralai/Mistral-7B-Instruct-v0.2`` (a system prompt is folded into the first user turn). None lays
            the messages out without a template (:class:`~tune.data.PlainChatFormat`: BOS, each message's text,
            EOS after each answer). Any other template (a callable, or its dotted path) is applied to the messages,
            which are then laid out without a template, as torchtune does.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """

    def __init__(
        self,
        path: str,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = MistralChatTemplate(),  # noqa: B008 (stateless)
    ) -> None:
        sp = SentencePieceBaseTokenizer(path)
        chat_format, template = select_chat_format(
            _chat_template_name(prompt_template),
            _CHAT_TEMPLATE_NAMES,
            MistralChatFormat("<s>", "</s>"),
            PlainChatFormat("<s>", "</s>"),
        )
        super().__init__(
            sp,
            chat_format,
            bos_id=sp.bos_id,
            eos_id=sp.eos_id,
            pad_id=sp.pad_id,
            stop_tokens=[sp.eos_id],
            special_tokens={"<s>": sp.bos_id, "</s>": sp.eos_id},
            max_seq_len=max_seq_len,
            prompt_template=template,
        )


def mistral_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = MISTRAL_CHAT_TEMPLATE,
) -> MistralTokenizer:
    """The Mistral 7B tokenizer with the ``[INST]`` chat format of ``mistralai/Mixtral-8x7B-Instruct-v0.1`` (the
    same template as ``Mistral-7B-Instruct-v0.2``; a system prompt is folded into the first user turn).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune; see :class:`MistralTokenizer`. The
            default, ``"tune.models.mistral.MistralChatTemplate"``, selects the chat format above.

    Returns:
        MistralTokenizer: BOS ``<s>``, EOS ``</s>``, pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    return MistralTokenizer(path, max_seq_len, prompt_template)
