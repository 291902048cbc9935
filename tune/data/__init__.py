"""Data building blocks: messages, tokenizer protocols, chat formats, masking, collation and packing."""

from tune.data._common import CROSS_ENTROPY_IGNORE_IDX
from tune.data._messages import ROLES, Message, Role
from tune.data._protocols import BaseTokenizer, ModelTokenizer

__all__ = [
    "CROSS_ENTROPY_IGNORE_IDX",
    "BaseTokenizer",
    "Message",
    "ModelTokenizer",
    "ROLES",
    "Role",
]
