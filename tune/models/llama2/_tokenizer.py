"""Llama 2 tokenizer: SentencePiece ``tokenizer.model`` with the Llama 2 chat format."""

from tune.data._chat_formats import Llama2ChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer


def llama2_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
) -> ChatTokenizer:
    """The Llama 2 tokenizer with the ``[INST] <<SYS>>`` chat format of ``meta-llama/Llama-2-7b-chat-hf``.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece) of a Llama 2 checkpoint.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        ChatTokenizer: BOS ``<s>`` (1), EOS ``</s>`` (2), pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    sp = SentencePieceBaseTokenizer(path)
    return ChatTokenizer(
        sp,
        Llama2ChatFormat(bos_token="<s>", eos_token="</s>"),
        bos_id=sp.bos_id,
        eos_id=sp.eos_id,
        pad_id=sp.pad_id,
        stop_tokens=[sp.eos_id],
        special_tokens={"<s>": sp.bos_id, "</s>": sp.eos_id},
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
    )
