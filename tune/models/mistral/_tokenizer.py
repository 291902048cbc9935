"""Mistral tokenizer: SentencePiece ``tokenizer.model`` with the Mistral ``[INST]`` chat format."""

from tune.data._chat_formats import MistralChatFormat, PlainChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format

# The name of the family's chat template, as torchtune configs spell it (``tune.`` or ``torchtune.``): selects
# the chat format below.
MISTRAL_CHAT_TEMPLATE = "tune.models.mistral.MistralChatTemplate"
_CHAT_TEMPLATE_NAMES = frozenset({MISTRAL_CHAT_TEMPLATE, "torchtune.models.mistral.MistralChatTemplate"})


def mistral_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = MISTRAL_CHAT_TEMPLATE,
) -> ChatTokenizer:
    """The Mistral 7B tokenizer with the ``[INST]`` chat format of ``mistralai/Mixtral-8x7B-Instruct-v0.1`` (the
    same template as ``Mistral-7B-Instruct-v0.2``; a system prompt is folded into the first user turn).

    ``[INST]`` and ``[/INST]`` are encoded as text, as in the 32000-piece v0.1/v0.2 vocabulary. The v0.3 vocabulary
    has them as control tokens, which this builder does not use.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune. The default,
            ``"tune.models.mistral.MistralChatTemplate"`` (``torchtune.`` is accepted too), selects the chat format
            above.
            None lays the messages out without a template (:class:`~tune.data.PlainChatFormat`: BOS, each message's
            text, EOS after each answer; e.g. for Alpaca, whose prompt is in the text). Any other template (a
            callable, or its dotted path) is applied to the messages, which are then laid out without a template.

    Returns:
        ChatTokenizer: BOS ``<s>``, EOS ``</s>``, pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    sp = SentencePieceBaseTokenizer(path)
    chat_format, template = select_chat_format(
        prompt_template, _CHAT_TEMPLATE_NAMES, MistralChatFormat("<s>", "</s>"), PlainChatFormat("<s>", "</s>")
    )
    return ChatTokenizer(
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
