"""Model-agnostic building blocks of decoder-only transformers (single-device, plain ``nn.Module``s)."""

from tune.modules._attention import MultiHeadAttention
from tune.modules._attention_utils import (
    causal_mask,
    create_block_causal_mask,
    get_block_causal_mask_from_document_ids,
    get_causal_mask_from_padding_mask,
    get_position_ids_from_padding_mask,
)
from tune.modules._feed_forward import FeedForward
from tune.modules._kv_cache import KVCache
from tune.modules._position_embeddings import Llama3ScaledRoPE, RotaryPositionalEmbeddings
from tune.modules._rms_norm import RMSNorm
from tune.modules._tied_linear import TiedLinear
from tune.modules._transformer import TransformerDecoder, TransformerSelfAttentionLayer

__all__ = [
    "FeedForward",
    "KVCache",
    "Llama3ScaledRoPE",
    "MultiHeadAttention",
    "RMSNorm",
    "RotaryPositionalEmbeddings",
    "TiedLinear",
    "TransformerDecoder",
    "TransformerSelfAttentionLayer",
    "causal_mask",
    "create_block_causal_mask",
    "get_block_causal_mask_from_document_ids",
    "get_causal_mask_from_padding_mask",
    "get_position_ids_from_padding_mask",
]
