"""Mistral tokenizer: SentencePiece ``tokenizer.model`` with the Mistral ``[INST]`` chat format."""

from tune.data._chat_formats import MistralChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, SentencePieceBaseTokenizer


def mistral_tokenizer(
    path: str, max_seq_len: int | None = None, prompt_template: "PromptTemplate | str | None" = None
) -> ChatTokenizer:
    """The Mistral 7B tokenizer with the ``[INST]`` chat format of ``mistralai/Mixtral-8x7B-Instruct-v0.1`` (the
    same template as ``Mistral-7B-Instruct-v0.2``; a system prompt is folded into the first user turn).

    ``[INST]`` and ``[/INST]`` are encoded as text, as in the 32000-piece v0.1/v0.2 vocabulary. The v0.3 vocabulary
    has them as control tokens, which this builder does not use.

    Args:
        path (str): ``tokenizer.model`` (SentencePiece).
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.

    Returns:
        ChatTokenizer: BOS ``<s>``, EOS ``</s>``, pad 0, stop tokens ``[</s>]``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    sp = SentencePieceBaseTokenizer(path)
    return ChatTokenizer(
        sp,
        MistralChatFormat(bos_token="<s>", eos_token="</s>"),
        bos_id=sp.bos_id,
        eos_id=sp.eos_id,
        pad_id=sp.pad_id,
        stop_tokens=[sp.eos_id],
        special_tokens={"<s>": sp.bos_id, "</s>": sp.eos_id},
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
    )
