"""Qwen 3 tokenizer: Qwen's byte-level BPE with ChatML and ``<think>`` blocks."""

from tune.data._chat_formats import Qwen3ChatFormat
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, load_byte_level_bpe

# Same regex as Qwen 2 / 2.5 (digits one at a time).
QWEN3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens after the 151643 BPE entries, in id order; (content, special).
QWEN3_ADDED_TOKENS = [
    *[(t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>")],
    *[(t, True) for t in ("<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>")],
    *[(t, True) for t in ("<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")],
    *[(t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")],
    *[(t, False) for t in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>")],
    ("<think>", False),
    ("</think>", False),
]


def qwen3_tokenizer(
    path: str,
    merges_file: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
    enable_thinking: bool = True,
) -> ChatTokenizer:
    """The Qwen 3 tokenizer with the chat format of ``Qwen/Qwen3-8B`` (see
    :class:`~tune.data._chat_formats.Qwen3ChatFormat` for how ``<think>`` blocks are written and trained).

    Args:
        path (str): ``tokenizer.json`` or its directory; or ``vocab.json`` when ``merges_file`` is given.
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens_path (str | None): a tokenizer.json whose ``added_tokens`` are used with vocab/merges.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.
        enable_thinking (bool): False ends generation prompts in an empty think block.

    Returns:
        ChatTokenizer: no BOS, EOS and pad ``<|endoftext|>``, stop tokens ``[<|im_end|>, <|endoftext|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without merges_file.
    """
    text = load_byte_level_bpe(
        path, merges_file, special_tokens_path, pattern=QWEN3_PATTERN, added_tokens=QWEN3_ADDED_TOKENS
    )
    end_of_text, im_end = text.token_id("<|endoftext|>"), text.token_id("<|im_end|>")
    return ChatTokenizer(
        text,
        Qwen3ChatFormat(enable_thinking=enable_thinking),
        bos_id=None,
        eos_id=end_of_text,
        pad_id=end_of_text,
        stop_tokens=[im_end, end_of_text],
        special_tokens={
            "<|endoftext|>": end_of_text,
            "<|im_start|>": text.token_id("<|im_start|>"),
            "<|im_end|>": im_end,
        },
        max_seq_len=max_seq_len,
        prompt_template=prompt_template,
    )
