"""Model-agnostic building blocks of decoder-only transformers (single-device, plain ``nn.Module``s)."""

from tune.modules._attention import MultiHeadAttention
from tune.modules._attention_utils import (
    causal_mask,
    create_block_causal_mask,
    get_block_causal_mask_from_document_ids,
    get_causal_mask_from_padding_mask,
    get_position_ids_from_padding_mask,
    packed_block_causal_mask,
)
from tune.modules._cache_utils import delete_kv_caches, disable_kv_cache, local_kv_cache
from tune.modules._context_parallel import ContextParallelMask
from tune.modules._cross_attention import TransformerCrossAttentionLayer
from tune.modules._decoder_wrapper import DecoderWrapper
from tune.modules._feed_forward import FeedForward
from tune.modules._kv_cache import KVCache
from tune.modules._layer_dropout import LayerDropout, ModuleLayerDropoutWrapper, ScaleType, prepare_layer_dropout
from tune.modules._layer_norm import Fp32LayerNorm
from tune.modules._long_rope import LongRoPE
from tune.modules._mrope import MultimodalRotaryEmbeddings
from tune.modules._position_embeddings import LinearScaledRoPE, Llama3ScaledRoPE, RotaryPositionalEmbeddings
from tune.modules._rms_norm import RMSNorm
from tune.modules._tanh_gate import TanhGate
from tune.modules._tied_linear import TiedLinear
from tune.modules._transformer import TransformerDecoder, TransformerSelfAttentionLayer
from tune.modules._vision_transformer import VisionTransformer
from tune.modules.low_precision import FrozenNF4Linear, reparametrize_as_dtype_state_dict_post_hook

__all__ = [
    "ContextParallelMask",
    "DecoderWrapper",
    "FeedForward",
    "Fp32LayerNorm",
    "FrozenNF4Linear",
    "KVCache",
    "LayerDropout",
    "LinearScaledRoPE",
    "Llama3ScaledRoPE",
    "LongRoPE",
    "ModuleLayerDropoutWrapper",
    "MultimodalRotaryEmbeddings",
    "MultiHeadAttention",
    "RMSNorm",
    "RotaryPositionalEmbeddings",
    "ScaleType",
    "TanhGate",
    "TiedLinear",
    "TransformerCrossAttentionLayer",
    "TransformerDecoder",
    "TransformerSelfAttentionLayer",
    "VisionTransformer",
    "causal_mask",
    "create_block_causal_mask",
    "delete_kv_caches",
    "disable_kv_cache",
    "get_block_causal_mask_from_document_ids",
    "get_causal_mask_from_padding_mask",
    "get_position_ids_from_padding_mask",
    "local_kv_cache",
    "packed_block_causal_mask",
    "prepare_layer_dropout",
    "reparametrize_as_dtype_state_dict_post_hook",
]
