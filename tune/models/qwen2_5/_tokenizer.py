"""Qwen 2.5 tokenizer: byte-level BPE (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) with ChatML."""

from typing import Any

from tune.data._chat_formats import QWEN2_5_DEFAULT_SYSTEM_PROMPT, Qwen2_5ChatFormat
from tune.data._tokenizers import ChatTokenizer, HuggingFaceBaseTokenizer, PromptTemplate, load_byte_level_bpe
from tune.models._common import check_torchtune_bpe_options

# Qwen 2's pre-tokenisation regex (as in its tokenizer.json): like Llama 3's, but digits one at a time.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens after the 151643 BPE entries, in id order; (content, special). <tool_call> tags are not special.
QWEN2_5_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]


def qwen2_5_tokenizer(
    path: str,
    merges_file: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
    default_system_prompt: str | None = QWEN2_5_DEFAULT_SYSTEM_PROMPT,
    **kwargs: Any,
) -> ChatTokenizer:
    """The Qwen 2.5 tokenizer with the ChatML format of ``Qwen/Qwen2.5-7B-Instruct``.

    Args:
        path (str): ``tokenizer.json`` or its directory; or ``vocab.json`` when ``merges_file`` is given
            (torchtune's arguments).
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens_path (str | None): a tokenizer.json whose ``added_tokens`` are used with vocab/merges.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): applied to messages before the chat format.
        default_system_prompt (str | None): inserted when a conversation has no system message, as the real
            template does; None inserts nothing.
        **kwargs: torchtune's tokenizer options, accepted where tune behaves so: ``bpe_cache_size`` (any value;
            tune's BPE needs no cache size) and ``errors="replace"`` (how invalid UTF-8 is decoded).

    Returns:
        ChatTokenizer: no BOS, EOS and pad ``<|endoftext|>``, stop tokens ``[<|im_end|>, <|endoftext|>]``.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without merges_file, or a torchtune option tune does not offer.
    """
    check_torchtune_bpe_options(kwargs)
    text = load_byte_level_bpe(
        path, merges_file, special_tokens_path, pattern=QWEN2_PATTERN, added_tokens=QWEN2_5_ADDED_TOKENS
    )
    return _qwen_chat_tokenizer(text, Qwen2_5ChatFormat(default_system_prompt), max_seq_len, prompt_template)


def _qwen_chat_tokenizer(text: HuggingFaceBaseTokenizer, chat_format, max_seq_len, prompt_template) -> ChatTokenizer:
    """Wraps a Qwen text tokenizer with its special ids."""
    end_of_text, im_end = text.token_id("<|endoftext|>"), text.token_id("<|im_end|>")
    return ChatTokenizer(
        text,
        chat_format,
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
