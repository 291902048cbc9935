"""torchtune's ``torchtune.modules.transforms.tokenizers`` path for tune's tokenizer classes and helpers (they live
in ``tune.data``)."""

from tune.data import (
    BaseTokenizer,
    HuggingFaceBaseTokenizer,
    ModelTokenizer,
    SentencePieceBaseTokenizer,
    TikTokenBaseTokenizer,
)
from tune.data._tokenizers import GPT2BaseTokenizer, parse_hf_tokenizer_json, tokenize_messages_no_special_tokens

__all__ = [
    "BaseTokenizer",
    "GPT2BaseTokenizer",
    "HuggingFaceBaseTokenizer",
    "ModelTokenizer",
    "SentencePieceBaseTokenizer",
    "TikTokenBaseTokenizer",
    "parse_hf_tokenizer_json",
    "tokenize_messages_no_special_tokens",
]
