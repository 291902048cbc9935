"""Text tokenizers (SentencePiece, tiktoken, Hugging Face tokenizer.json) and the chat-aware model tokenizer."""

from tune.data._tokenizers._chat import (
    ChatTokenizer,
    PromptTemplate,
    TextTokenizer,
    resolve_prompt_template,
    select_chat_format,
)
from tune.data._tokenizers._huggingface import HuggingFaceBaseTokenizer, byte_level_bpe_tokenizer, load_byte_level_bpe
from tune.data._tokenizers._sentencepiece import SentencePieceBaseTokenizer
from tune.data._tokenizers._tiktoken import TikTokenBaseTokenizer, load_tiktoken_ranks
from tune.data._tokenizers._utils import TokenizerFileError, TokenizerFileNotFoundError, read_json_file, truncate

__all__ = [
    "ChatTokenizer",
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
    "read_json_file",
    "resolve_prompt_template",
    "select_chat_format",
    "truncate",
]
