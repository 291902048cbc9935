"""Llama 2 tokenizer: SentencePiece ``tokenizer.model`` with the Llama 2 chat format."""

from tune.data._chat_formats import Llama2ChatFormat, PlainChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format
from tune.models.llama2._prompt_template import Llama2ChatTemplate

# The name of the family's chat template, as torchtune configs spell it (``tune.`` or ``torchtune.``): selects
# the chat format below.
LLAMA2_CHAT_TEMPLATE = "tune.models.llama2.Llama2ChatTemplate"
_CHAT_TEMPLATE_NAMES = frozenset({LLAMA2_CHAT_TEMPLATE, "torchtune.models.llama2.Llama2ChatTemplate"})


def _chat_template_name(prompt_template: object) -> object:
    """The family's chat template given as an instance or the class, by its dotted name (other values unchanged)."""
    if prompt_template is Llama2ChatTemplate or isinstance(prompt_template, Llama2ChatTemplate):
        return LLAMA2_CHAT_TEMPLATE
    return prompt_template


class Llama2Tokenizer(ChatTokenizer):
    """The Llama 2 tokenizer (torchtune's class; :func:`llama2_tokenizer` returns one).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): :class:`Llama2ChatTemplate` (the default; an instance, the
            class or its dotted name, ``tune.`` or ``torchtune.``) selects the ``[INST] <<SYS>>`` chat format
            of ``meta-llama/Llama-2-7b-chat-hf``. None lays the messages out without a template
            (:class:`~tune.data.PlainChatFormat`: BOS, each message's text, EOS after each answer; e.g. for
            Alpaca, whose prompt is in the text). Any other template (a callable, or its dotted path) is applied
            to the messages, which are then laid out without a template, as torchtune does.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """

    def __init__(
        self,
        path: str,
        max_seq_len: int | None = None,
        prompt_template: "PromptTemplate | str | None" = Llama2ChatTemplate(),  # noqa: B008 (stateless)
    ) -> None:
        sp = SentencePieceBaseTokenizer(path)
        chat_format, template = select_chat_format(
            _chat_template_name(prompt_template),
            _CHAT_TEMPLATE_NAMES,
            Llama2ChatFormat("<s>", "</s>"),
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


def llama2_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = LLAMA2_CHAT_TEMPLATE,
) -> Llama2Tokenizer:
    """The Llama 2 tokenizer with the ``[INST] <<SYS>>`` chat format of ``meta-llama/Llama-2-7b-chat-hf``.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune; see :class:`Llama2Tokenizer`. The default,
            ``"tune.models.llama2.Llama2ChatTemplate"``, selects the chat format above.

    Returns:
        Llama2Tokenizer: BOS ``<s>`` (1), EOS ``</s>`` (2), pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    return Llama2Tokenizer(path, max_seq_len, prompt_template)
