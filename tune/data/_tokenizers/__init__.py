"""Text tokenizers (SentencePiece, tiktoken, Hugging Face tokenizer.json) and the chat-aware model tokenizer."""

from tune.data._tokenizers._chat import (
    ChatTokenizer,
    PromptTemplate,
    TextTokenizer,
    resolve_prompt_template,
    select_chat_format,
)
from tune.data._tokenizers._compat import (
    GPT2BaseTokenizer,
    parse_hf_tokenizer_json,
    tokenize_messages_no_special_tokens,
)
from tune.data._tokenizers._huggingface import HuggingFaceBaseTokenizer, byte_level_bpe_tokenizer, load_byte_level_bpe
from tune.data._tokenizers._sentencepiece import SentencePieceBaseTokenizer
from tune.data._tokenizers._tiktoken import TikTokenBaseTokenizer, load_tiktoken_ranks
from tune.data._tokenizers._utils import TokenizerFileError, TokenizerFileNotFoundError, read_json_file, truncate

__all__ = [
    "ChatTokenizer",
    "GPT2BaseTokenizer",
    "HuggingFaceBaseTokenizer",
    "PromptTemplate",
    "SentencePieceBaseTokenizer",
    "TextTokenizer",
    "TikTokenBaseTokenizer",
    "TokenizerFileError",
    "TokenizerFileNotFoundError",
    "byte_level_bpe_tokenizer",
    "load_byte_level_bpe",
    "load_tiktoken_ranks",
    "parse_hf_tokenizer_json",
    "read_json_file",
    "resolve_prompt_template",
    "select_chat_format",
    "tokenize_messages_no_special_tokens",
    "truncate",
]
