"""Gemma tokenizer: SentencePiece ``tokenizer.model`` with the ``<start_of_turn>`` chat format (Gemma and Gemma 2)."""

from tune.data._chat_formats import Gemma2ChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer


class GemmaTokenizer(ChatTokenizer):
    """The Gemma tokenizer (torchtune's class; :func:`gemma_tokenizer` and ``tune.models.gemma2.gemma2_tokenizer``
    return one), with the chat format of ``google/gemma-7b-it`` and ``google/gemma-2-2b-it`` (one template):
    ``<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n...<end_of_turn>\\n`` after ``<bos>``.

    A system message is folded into the first user turn (followed by a blank line) as Gemma 3's template does;
    the Gemma and Gemma 2 templates reject system messages.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma or Gemma 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """

    def __init__(
        self, path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
    ) -> None:
        sp = SentencePieceBaseTokenizer(path)
        end_of_turn = sp.token_id("<end_of_turn>")
        super().__init__(
            sp,
            Gemma2ChatFormat(bos_token="<bos>"),
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
    """The Gemma tokenizer with the chat format of ``google/gemma-7b-it`` (see :class:`GemmaTokenizer`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma or Gemma 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        GemmaTokenizer: BOS ``<bos>``, EOS ``<eos>``, pad ``<pad>``, stop tokens ``[<eos>, <end_of_turn>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """
    return GemmaTokenizer(path, max_seq_len, prompt_template)
