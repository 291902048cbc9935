"""Llama 2 tokenizer: SentencePiece ``tokenizer.model`` with the Llama 2 chat format."""

from tune.data._chat_formats import Llama2ChatFormat, PlainChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format

# The name of the family's chat template, as torchtune configs spell it (``tune.`` or ``torchtune.``): selects
# the chat format below.
LLAMA2_CHAT_TEMPLATE = "tune.models.llama2.Llama2ChatTemplate"
_CHAT_TEMPLATE_NAMES = frozenset({LLAMA2_CHAT_TEMPLATE, "torchtune.models.llama2.Llama2ChatTemplate"})


def llama2_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = LLAMA2_CHAT_TEMPLATE,
) -> ChatTokenizer:
    """The Llama 2 tokenizer with the ``[INST] <<SYS>>`` chat format of ``meta-llama/Llama-2-7b-chat-hf``.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune. The default,
            ``"tune.models.llama2.Llama2ChatTemplate"`` (``torchtune.`` is accepted too), selects the chat format
            above.
            None lays the messages out without a template (:class:`~tune.data.PlainChatFormat`: BOS, each message's
            text, EOS after each answer; e.g. for Alpaca, whose prompt is in the text). Any other template (a
            callable, or its dotted path) is applied to the messages, which are then laid out without a template.

    Returns:
        ChatTokenizer: BOS ``<s>`` (1), EOS ``</s>`` (2), pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    sp = SentencePieceBaseTokenizer(path)
    chat_format, template = select_chat_format(
        prompt_template, _CHAT_TEMPLATE_NAMES, Llama2ChatFormat("<s>", "</s>"), PlainChatFormat("<s>", "</s>")
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
