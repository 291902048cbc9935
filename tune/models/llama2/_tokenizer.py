"""Llama 2 tokenizer: SentencePiece ``tokenizer.model`` with torchtune's Llama 2 chat template, or tune's Hugging
Face-exact Llama 2 chat format."""

from tune.data._chat_formats import Llama2ChatFormat, PlainChatFormat
from tune.data._prompt_templates import Llama2ChatTemplate
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer, select_chat_format

# tune's name for the Hugging Face-exact Llama 2 chat format, as ``prompt_template`` (torchtune's
# Llama2ChatTemplate, the default, keeps torchtune's tokens instead).
LLAMA2_CHAT_FORMAT = "tune.data.Llama2ChatFormat"


def _chat_format_name(prompt_template: object) -> object:
    """:class:`~tune.data.Llama2ChatFormat` given as the class or an instance, by its dotted name; torchtune's
    dotted name of the template, the template (other values unchanged)."""
    if prompt_template is Llama2ChatFormat or isinstance(prompt_template, Llama2ChatFormat):
        return LLAMA2_CHAT_FORMAT
    if prompt_template == "torchtune.models.llama2.Llama2ChatTemplate":  # a config's spelling before `tune migrate`
        return Llama2ChatTemplate()
    return prompt_template


class Llama2Tokenizer(ChatTokenizer):
    """The Llama 2 tokenizer (torchtune's class; :func:`llama2_tokenizer` returns one).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune, a template (a callable, or its dotted path;
            the default is torchtune's :class:`Llama2ChatTemplate`) is applied to the messages, which are then
            laid out without a chat format (:class:`~tune.data.PlainChatFormat`: BOS, each text part, EOS after
            each answer), giving torchtune's tokens; None lays them out with no template (e.g. for Alpaca, whose
            prompt is in the text). tune's :class:`~tune.data.Llama2ChatFormat` (the class, an instance or
            ``"tune.data.Llama2ChatFormat"``) selects instead the chat format of
            ``meta-llama/Llama-2-7b-chat-hf``, token for token, which tune's own configs use.

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
            _chat_format_name(prompt_template),
            {LLAMA2_CHAT_FORMAT},
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
    prompt_template: "PromptTemplate | str | None" = "tune.models.llama2.Llama2ChatTemplate",
) -> Llama2Tokenizer:
    """The Llama 2 tokenizer, by default with torchtune's ``Llama2ChatTemplate`` (torchtune's tokens).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): as in torchtune; see :class:`Llama2Tokenizer`.
            ``"tune.data.Llama2ChatFormat"`` selects the Hugging Face-exact chat format.

    Returns:
        Llama2Tokenizer: BOS ``<s>`` (1), EOS ``</s>`` (2), pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    return Llama2Tokenizer(path, max_seq_len, prompt_template)
