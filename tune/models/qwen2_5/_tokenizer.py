"""Qwen 2.5 tokenizer: byte-level BPE (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) with ChatML."""

from typing import Any

from tune.data._chat_formats import Qwen2_5ChatFormat, Qwen2ChatFormat, TorchtuneQwen2Format, named_chat_format
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
    **kwargs: Any,
) -> ChatTokenizer:
    """The Qwen 2.5 tokenizer. With ``vocab.json`` + ``merges.txt`` (torchtune's files) conversations are laid
    out as torchtune lays them out (:class:`TorchtuneQwen2Format`: no default system prompt, the last
    answer ends with ``<|im_end|>`` as EOS, headers carry their message's mask); ``prompt_template:
    tune.data.Qwen2_5ChatFormat`` selects the chat template of ``Qwen/Qwen2.5-7B-Instruct`` token for token (its
    default system prompt inserted), as tune's configs do. A ``tokenizer.json`` (which torchtune did not take)
    gets that chat template unless another is named.

    Args:
        path (str): ``tokenizer.json`` or its directory; or ``vocab.json`` when ``merges_file`` is given
            (torchtune's arguments).
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens_path (str | None): a tokenizer.json whose ``added_tokens`` are used with vocab/merges.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages (as in
            torchtune), or :class:`~tune.data.Qwen2_5ChatFormat` / :class:`~tune.data.Qwen2ChatFormat` (by dotted
            name, class or instance; ``Qwen2_5ChatFormat(None)`` inserts no system prompt): that Hugging Face chat
            template instead of torchtune's layout.
        **kwargs: torchtune's tokenizer options, accepted where tune behaves so: ``bpe_cache_size`` (any value;
            tune's BPE needs no cache size) and ``errors="replace"`` (how invalid UTF-8 is decoded).

    Returns:
        ChatTokenizer: no BOS, pad ``<|endoftext|>``, stop tokens ``[<|im_end|>, <|endoftext|>]``; EOS
        ``<|im_end|>`` in torchtune's layout (as torchtune), ``<|endoftext|>`` with a Hugging Face chat template.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without merges_file, or a torchtune option tune does not offer.
    """
    check_torchtune_bpe_options(kwargs)
    text = load_byte_level_bpe(
        path, merges_file, special_tokens_path, pattern=QWEN2_PATTERN, added_tokens=QWEN2_5_ADDED_TOKENS
    )
    chat_format = named_chat_format(prompt_template, (Qwen2_5ChatFormat, Qwen2ChatFormat))
    if chat_format is not None:
        prompt_template = None
    elif merges_file is None:
        chat_format = Qwen2_5ChatFormat()
    else:
        chat_format = TorchtuneQwen2Format(tool_responses=True)
    return _qwen_chat_tokenizer(text, chat_format, max_seq_len, prompt_template)


def _qwen_chat_tokenizer(text: HuggingFaceBaseTokenizer, chat_format, max_seq_len, prompt_template) -> ChatTokenizer:
    """Wraps a Qwen text tokenizer with its special ids (torchtune's EOS, ``<|im_end|>``, in torchtune's layout)."""
    end_of_text, im_end = text.token_id("<|endoftext|>"), text.token_id("<|im_end|>")
    return ChatTokenizer(
        text,
        chat_format,
        bos_id=None,
        eos_id=im_end if isinstance(chat_format, TorchtuneQwen2Format) else end_of_text,
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
