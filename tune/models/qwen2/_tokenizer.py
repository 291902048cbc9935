"""Qwen2 tokenizer: byte-level BPE (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) with ChatML."""

import json
from pathlib import Path
from typing import Any

from tune.data._chat_formats import (  # noqa: F401  (QWEN2_DEFAULT_SYSTEM_PROMPT: re-exported by tune.models.qwen2)
    QWEN2_DEFAULT_SYSTEM_PROMPT,
    Qwen2_5ChatFormat,
    Qwen2ChatFormat,
    TorchtuneQwen2Format,
    named_chat_format,
)
from tune.data._tokenizers import ChatTokenizer, PromptTemplate, load_byte_level_bpe
from tune.models._common import check_torchtune_bpe_options
from tune.models.qwen2_5 import QWEN2_PATTERN

# Qwen2's special tokens (its tokenizer.json's added tokens), numbered after the 151643 BPE entries.
QWEN2_SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


class Qwen2Tokenizer(ChatTokenizer):
    """The Qwen2 tokenizer (torchtune's class; :func:`qwen2_tokenizer` returns one). With ``vocab.json`` +
    ``merges.txt`` (torchtune's files) conversations are laid out as torchtune lays them out
    (:class:`TorchtuneQwen2Format`: no default system prompt, the last answer ends with ``<|im_end|>``
    as EOS, headers carry their message's mask); ``prompt_template: tune.data.Qwen2ChatFormat`` selects the chat
    template of ``Qwen/Qwen2-7B-Instruct`` token for token (its default system prompt inserted), as tune's configs
    do. A ``tokenizer.json`` (which torchtune did not take) gets that chat template unless another is named.

    Args:
        path (str): ``vocab.json`` (with ``merges_file``), or ``tokenizer.json`` / its directory.
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens (dict[str, int]): added token -> id, in id order after the BPE entries. Default Qwen2's
            three.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): a prompt template applied to the messages (as in
            torchtune), or :class:`~tune.data.Qwen2ChatFormat` / :class:`~tune.data.Qwen2_5ChatFormat` (by dotted
            name, class or instance): that Hugging Face chat template instead of torchtune's layout.
        errors (str): how invalid UTF-8 is decoded; only ``"replace"``. Default "replace".
        unk_token, bos_token (str | None): only None (Qwen2 has neither). Default None.
        eos_token (str): the end-of-turn token; only ``"<|im_end|>"``. Default "<|im_end|>".
        pad_token (str | None): only ``"<|endoftext|>"``. Default "<|endoftext|>".
        bpe_cache_size (int): accepted and unused (tune's BPE needs no cache size). Default 152064.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without merges_file, or a torchtune option tune does not offer.
    """

    def __init__(
        self,
        path: str,
        merges_file: str | None,
        special_tokens: dict[str, int] = QWEN2_SPECIAL_TOKENS,
        max_seq_len: int | None = None,
        *,
        prompt_template: "PromptTemplate | str | None" = None,
        errors: str = "replace",
        unk_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str = "<|im_end|>",
        pad_token: str | None = "<|endoftext|>",
        bpe_cache_size: int = 152064,
    ) -> None:
        check_torchtune_bpe_options({"errors": errors})
        given = {"unk_token": unk_token, "bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token}
        fixed = {"unk_token": None, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        changed = sorted(name for name, value in given.items() if value != fixed[name])
        if changed:
            raise ValueError(
                f"Unsupported tokenizer option(s) {changed}: tune's Qwen2 tokenizer has no UNK or BOS token, ends "
                "each turn with <|im_end|> and pads with <|endoftext|>; remove these arguments."
            )
        added = [(token, True) for token, _ in sorted(special_tokens.items(), key=lambda item: item[1])]
        text = load_byte_level_bpe(path, merges_file, None, pattern=QWEN2_PATTERN, added_tokens=added)
        end_of_text, im_end = text.token_id("<|endoftext|>"), text.token_id("<|im_end|>")
        chat_format = named_chat_format(prompt_template, (Qwen2ChatFormat, Qwen2_5ChatFormat))
        if chat_format is not None:
            prompt_template = None
        elif merges_file is None:
            chat_format = Qwen2ChatFormat()
        else:
            chat_format = TorchtuneQwen2Format(tool_responses=False)
        torchtune_layout = isinstance(chat_format, TorchtuneQwen2Format)
        super().__init__(
            text,
            chat_format,
            bos_id=None,
            eos_id=im_end if torchtune_layout else end_of_text,  # torchtune's EOS for Qwen is <|im_end|>
            pad_id=end_of_text,
            stop_tokens=[im_end, end_of_text],
            special_tokens={token: text.token_id(token) for token in special_tokens},
            max_seq_len=max_seq_len,
            prompt_template=prompt_template,
        )


def qwen2_tokenizer(
    path: str,
    merges_file: str | None = None,
    special_tokens_path: str | None = None,
    max_seq_len: int | None = None,
    prompt_template: "PromptTemplate | str | None" = None,
    **kwargs: Any,
) -> Qwen2Tokenizer:
    """The Qwen2 tokenizer: torchtune's layout with torchtune's files, ``Qwen/Qwen2-7B-Instruct``'s chat template
    with ``prompt_template="tune.data.Qwen2ChatFormat"`` (see :class:`Qwen2Tokenizer`).

    Args:
        path (str): ``vocab.json`` (with ``merges_file``), or ``tokenizer.json`` / its directory.
        merges_file (str | None): ``merges.txt``, with ``path`` a ``vocab.json``.
        special_tokens_path (str | None): a tokenizer.json whose ``added_tokens`` are the special tokens.
        max_seq_len (int | None): conversations are truncated to this many tokens when set.
        prompt_template (PromptTemplate | str | None): see :class:`Qwen2Tokenizer`.
        **kwargs: torchtune's options of :class:`Qwen2Tokenizer`.

    Returns:
        Qwen2Tokenizer: no BOS, pad ``<|endoftext|>``, stop tokens ``[<|im_end|>, <|endoftext|>]``; EOS
        ``<|im_end|>`` in torchtune's layout (as torchtune), ``<|endoftext|>`` with a Hugging Face chat template.

    Raises:
        FileNotFoundError: if a file does not exist.
        ValueError: for a vocab.json without merges_file, or a torchtune option tune does not offer.
    """
    special = QWEN2_SPECIAL_TOKENS
    if special_tokens_path is not None:
        added = json.loads(Path(special_tokens_path).expanduser().read_text())["added_tokens"]
        special = {entry["content"]: int(entry["id"]) for entry in added}
    return Qwen2Tokenizer(path, merges_file, special, max_seq_len, prompt_template=prompt_template, **kwargs)
