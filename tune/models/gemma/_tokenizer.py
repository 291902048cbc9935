"""Gemma tokenizer: SentencePiece ``tokenizer.model`` (Gemma and Gemma 2), in torchtune's layout or with the
``<start_of_turn>`` chat template."""

from tune.data._chat_formats import Gemma2ChatFormat, GemmaChatFormat, PlainChatFormat, named_chat_format
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer


class GemmaTokenizer(ChatTokenizer):
    """The Gemma tokenizer (torchtune's class; :func:`gemma_tokenizer` and ``tune.models.gemma2.gemma2_tokenizer``
    return one).

    By default conversations are laid out as torchtune lays them out: no chat template, ``<bos>`` opening each
    turn, the messages' text, ``<eos>`` after each answer (:class:`~tune.data.PlainChatFormat`), after any
    ``prompt_template`` given. ``prompt_template: tune.data.GemmaChatFormat`` (or ``tune.data.Gemma2ChatFormat``)
    selects instead the chat template of ``google/gemma-7b-it`` and ``google/gemma-2-2b-it`` (one template):
    ``<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n...<end_of_turn>\\n`` after ``<bos>``, a system
    message folded into the first user turn (followed by a blank line) as Gemma 3's template does (the Gemma and
    Gemma 2 templates reject system messages).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma or Gemma 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages (as in torchtune),
            or :class:`~tune.data.GemmaChatFormat` / :class:`~tune.data.Gemma2ChatFormat` (by dotted name, class
            or instance): that chat template instead of torchtune's layout.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """

    def __init__(
        self, path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
    ) -> None:
        sp = SentencePieceBaseTokenizer(path)
        end_of_turn = sp.token_id("<end_of_turn>")
        chat_format = named_chat_format(prompt_template, (GemmaChatFormat, Gemma2ChatFormat))
        if chat_format is not None:
            prompt_template = None
        else:
            chat_format = PlainChatFormat(bos_token="<bos>", eos_token="<eos>")
        super().__init__(
            sp,
            chat_format,
            bos_id=sp.bos_id,
            eos_id=sp.eos_id,
            pad_id=sp.pad_id,
            stop_tokens=[sp.eos_id, end_of_turn],
            special_tokens={
                "<bos>": sp.bos_id,
                "<eos>": sp.eos_id,
                "<pad>": sp.pad_id,
                "<start_of_turn>": sp.token_id("<start_of_turn>"),
                "<end_of_turn>": end_of_turn,
            },
            max_seq_len=max_seq_len,
            prompt_template=prompt_template,
        )


def gemma_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
) -> GemmaTokenizer:
    """The Gemma tokenizer: torchtune's layout by default, the chat template of ``google/gemma-7b-it`` with
    ``prompt_template="tune.data.GemmaChatFormat"`` (see :class:`GemmaTokenizer`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma or Gemma 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): see :class:`GemmaTokenizer`.

    Returns:
        GemmaTokenizer: BOS ``<bos>``, EOS ``<eos>``, pad ``<pad>``, stop tokens ``[<eos>, <end_of_turn>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """
    return GemmaTokenizer(path, max_seq_len, prompt_template)
