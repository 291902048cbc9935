"""Gemma 2 tokenizer: Gemma's (``tune.models.gemma.GemmaTokenizer``: one SentencePiece model and chat format)."""

from tune.data._tokenizers import PromptTemplate
from tune.models.gemma import GemmaTokenizer, gemma_tokenizer

# tune's name for the Hugging Face-exact Gemma 2 chat format, gemma2_tokenizer's default
GEMMA2_CHAT_FORMAT = "tune.data.Gemma2ChatFormat"


def gemma2_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = GEMMA2_CHAT_FORMAT
) -> GemmaTokenizer:
    """The Gemma tokenizer with the chat template of ``google/gemma-2-2b-it`` by default (a tune name: torchtune's
    Gemma 2 configs name ``gemma_tokenizer``, which lays conversations out as torchtune does; see
    :class:`GemmaTokenizer`).

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma or Gemma 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): ``"tune.data.Gemma2ChatFormat"`` by default; None or a
            prompt template gives torchtune's layout (see :class:`GemmaTokenizer`).

    Returns:
        GemmaTokenizer: BOS ``<bos>``, EOS ``<eos>``, pad ``<pad>``, stop tokens ``[<eos>, <end_of_turn>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """
    return GemmaTokenizer(path, max_seq_len, prompt_template)


__all__ = ["GemmaTokenizer", "gemma2_tokenizer", "gemma_tokenizer"]  # gemma_tokenizer: the name torchtune's configs use
