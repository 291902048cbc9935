"""Gemma 3 tokenizer: Gemma's (``tune.models.gemma.GemmaTokenizer``: one SentencePiece model and chat format)."""

from tune.data import PromptTemplate
from tune.models.gemma import GemmaTokenizer


def gemma3_tokenizer(
    path: str,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = "tune.data.Gemma2ChatFormat",
) -> GemmaTokenizer:
    """The Gemma tokenizer with the chat format of ``google/gemma-3-1b-it``'s template.

    ``<bos>``, then each turn as ``<start_of_turn>{user|model}\\n{content, stripped}<end_of_turn>\\n``; a system
    message opens the first user turn followed by a blank line (Gemma 3 has no system role); with
    ``add_end_tokens=False`` the prompt ends with ``<start_of_turn>model\\n``. Only assistant turns are trained
    (with their ``<end_of_turn>``) when messages are masked.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Gemma 3 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): the chat format above (``"tune.data.Gemma2ChatFormat"``,
            the default); None or a prompt template gives torchtune's Gemma layout (see :class:`GemmaTokenizer`).

    Returns:
        GemmaTokenizer: BOS ``<bos>``, EOS ``<eos>``, pad ``<pad>``, stop tokens ``[<eos>, <end_of_turn>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the model lacks ``<start_of_turn>``/``<end_of_turn>``.
    """
    return GemmaTokenizer(path, max_seq_len, prompt_template)
