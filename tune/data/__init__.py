"""Data building blocks: messages, tokenizer protocols, chat formats, masking, collation and packing."""

from tune.data._chat_formats import (
    ChatFormat,
    Gemma2ChatFormat,
    GemmaChatFormat,
    Llama2ChatFormat,
    Llama3ChatFormat,
    MistralChatFormat,
    Phi3ChatFormat,
    Phi4ChatFormat,
    PlainChatFormat,
    Qwen2_5ChatFormat,
    Qwen2ChatFormat,
    Qwen3ChatFormat,
    Segment,
    validate_messages,
)
from tune.data._collate import (
    collate_for_dataset,
    is_packed,
    left_pad_sequence,
    padded_collate,
    padded_collate_dpo,
    padded_collate_generation,
    padded_collate_packed,
    padded_collate_sft,
    padding_free_collate,
)
from tune.data._common import CROSS_ENTROPY_IGNORE_IDX
from tune.data._image import load_image
from tune.data._kto_collate import padded_collate_kto
from tune.data._masking import MaskingStrategy, mask_messages
from tune.data._media import IMAGE_PLACEHOLDER, insert_image_segments, replace_images, tokenize_with_images
from tune.data._message_transforms import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    OpenAIToMessages,
    ShareGPTToMessages,
    alpaca_prompt,
)
from tune.data._messages import ROLES, Message, Role
from tune.data._multimodal_messages import TheCauldronToMessages, format_content_with_images
from tune.data._packing import FlatSequences, PackedDataset, block_causal_mask, flatten_dataset, pack_lengths
from tune.data._preview import render_sample
from tune.data._prompt_templates import (
    ChatMLTemplate,
    GrammarErrorCorrectionTemplate,
    PromptTemplate,
    PromptTemplateInterface,
    QuestionAnswerTemplate,
    SummarizeTemplate,
)
from tune.data._protocols import BaseTokenizer, ModelTokenizer
from tune.data._tokenizers import (
    ChatTokenizer,
    HuggingFaceBaseTokenizer,
    SentencePieceBaseTokenizer,
    TikTokenBaseTokenizer,
    TokenizerFileError,
    truncate,
)
from tune.data._vision_collate import padded_collate_images, padded_collate_tiled_images_and_mask

__all__ = [
    "padded_collate_images",
    "padded_collate_tiled_images_and_mask",
    "IMAGE_PLACEHOLDER",
    "insert_image_segments",
    "replace_images",
    "tokenize_with_images",
    "TokenizerFileError",
    "collate_for_dataset",
    "is_packed",
    "AlpacaToMessages",
    "ChosenRejectedToMessages",
    "FlatSequences",
    "InputOutputToMessages",
    "OpenAIToMessages",
    "PackedDataset",
    "ShareGPTToMessages",
    "TheCauldronToMessages",
    "format_content_with_images",
    "load_image",
    "alpaca_prompt",
    "block_causal_mask",
    "flatten_dataset",
    "left_pad_sequence",
    "pack_lengths",
    "padded_collate",
    "padded_collate_dpo",
    "padded_collate_generation",
    "padded_collate_kto",
    "padded_collate_packed",
    "padded_collate_sft",
    "padding_free_collate",
    "render_sample",
    "ChatMLTemplate",
    "GrammarErrorCorrectionTemplate",
    "PromptTemplate",
    "PromptTemplateInterface",
    "QuestionAnswerTemplate",
    "SummarizeTemplate",
    "ChatFormat",
    "ChatTokenizer",
    "Gemma2ChatFormat",
    "GemmaChatFormat",
    "HuggingFaceBaseTokenizer",
    "Llama2ChatFormat",
    "Llama3ChatFormat",
    "MaskingStrategy",
    "MistralChatFormat",
    "Phi3ChatFormat",
    "Phi4ChatFormat",
    "PlainChatFormat",
    "Qwen2_5ChatFormat",
    "Qwen2ChatFormat",
    "Qwen3ChatFormat",
    "Segment",
    "SentencePieceBaseTokenizer",
    "TikTokenBaseTokenizer",
    "mask_messages",
    "truncate",
    "validate_messages",
    "CROSS_ENTROPY_IGNORE_IDX",
    "BaseTokenizer",
    "Message",
    "ModelTokenizer",
    "ROLES",
    "Role",
]
