"""Every row of every family's ``MODEL_SIZES`` table (tune/models/<family>/_model_builders.py): registered with its
LoRA and QLoRA builders, built on the meta device with the hyperparameters of the published ``config.json`` of
its Hugging Face repo, and with exactly the parameter count of the transformers model built from those values.
"""

import inspect
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import tune.models
from tune.config import validate_config
from tune.models._common import ModelSize
from tune.modules import LinearScaledRoPE, Llama3ScaledRoPE, RMSNorm, TiedLinear, TransformerDecoder
from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")

FAMILIES = sorted(path.parent.name for path in Path(tune.models.__file__).parent.glob("*/_model_builders.py"))


def _table(family: str) -> dict[str, ModelSize]:
    return __import__(f"tune.models.{family}._model_builders", fromlist=["MODEL_SIZES"]).MODEL_SIZES


def _builds_a_decoder(family: str) -> bool:
    """A text family. A vision-language family's model is not one decoder: its sizes are checked in its own test
    file (parameter counts against transformers' multimodal model, its builders' arguments)."""
    builders = get_model_family(family).builders
    return all(inspect.signature(builders[name]).return_annotation is TransformerDecoder for name in _table(family))


DECODER_FAMILIES = [family for family in FAMILIES if _builds_a_decoder(family)]
SIZES = {name: (family, size) for family in DECODER_FAMILIES for name, size in _table(family).items()}


def _llama3_rope(factor: float) -> dict:
    return dict(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


# fmt: off
# Published hyperparameters, transcribed from each repo's config.json on the Hugging Face hub (no network in the
# tests). A key is left out where the file does not set it, or where it was not certain: nothing is compared there.
PUBLISHED = {
    "meta-llama/Llama-2-7b-hf": dict(
        model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
    "meta-llama/Llama-2-13b-hf": dict(
        model_type="llama", vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
    "meta-llama/Llama-2-70b-hf": dict(
        model_type="llama", vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
    "codellama/CodeLlama-7b-hf": dict(
        model_type="llama", vocab_size=32016, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=16384, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False),
    "codellama/CodeLlama-13b-hf": dict(
        model_type="llama", vocab_size=32016, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=16384, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False),
    "codellama/CodeLlama-70b-hf": dict(
        model_type="llama", vocab_size=32016, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=16384, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False),
    "meta-llama/Meta-Llama-3-8B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=False),
    "meta-llama/Meta-Llama-3-70B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=False),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=_llama3_rope(8.0), tie_word_embeddings=False),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=_llama3_rope(8.0), tie_word_embeddings=False),
    "meta-llama/Llama-3.1-405B": dict(
        model_type="llama", vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
        num_attention_heads=128, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=_llama3_rope(8.0), tie_word_embeddings=False),
    "meta-llama/Llama-3.2-1B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_llama3_rope(32.0), tie_word_embeddings=True),
    "meta-llama/Llama-3.2-3B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_llama3_rope(32.0), tie_word_embeddings=True),
    "meta-llama/Llama-3.3-70B-Instruct": dict(
        model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=_llama3_rope(8.0), tie_word_embeddings=False),
    "mistralai/Mistral-7B-v0.1": dict(
        model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False),
    "mistralai/Mistral-7B-Instruct-v0.3": dict(
        model_type="mistral", vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False),
    "mistralai/Mistral-Nemo-Instruct-2407": dict(
        model_type="mistral", vocab_size=131072, hidden_size=5120, intermediate_size=14336, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=1024000,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False),
    "microsoft/Phi-3-mini-4k-instruct": dict(
        model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, rope_scaling=None, sliding_window=2047, tie_word_embeddings=False, pad_token_id=32000),
    # rope_scaling (longrope, 48 + 48 factors) left out: tune's table does not carry the factors (read from the
    # checkpoint's config.json); sliding_window (262144, past every position) left out: tune builds no window
    "microsoft/Phi-3-mini-128k-instruct": dict(
        model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False),
    "microsoft/phi-4": dict(
        model_type="phi3", vocab_size=100352, hidden_size=5120, intermediate_size=17920, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=10, max_position_embeddings=16384, rms_norm_eps=1e-5,
        rope_theta=250000.0, rope_scaling=None, tie_word_embeddings=False),
    # hidden_act "gelu" (transformers reads it as the tanh approximation); tie_word_embeddings unset (tied)
    "google/gemma-2b": dict(
        model_type="gemma", vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
        rope_theta=10000.0),
    "google/gemma-7b": dict(
        model_type="gemma", vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, head_dim=256, max_position_embeddings=8192,
        rms_norm_eps=1e-6, rope_theta=10000.0),
    "google/gemma-2-2b-it": dict(
        model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
        rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=256),
    "google/gemma-2-9b-it": dict(
        model_type="gemma2", vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
        rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=256),
    "google/gemma-2-27b-it": dict(
        model_type="gemma2", vocab_size=256000, hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, max_position_embeddings=8192,
        rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=144),
    # Gemma 3: 270M and 1B are text-only (model_type gemma3_text); for 4B, 12B and 27B (multimodal, model_type
    # gemma3) the row is the config.json's text_config with Gemma3TextConfig's defaults for the keys it leaves out
    # (vocab_size 262208, rope_theta 1e6, rope_local_base_freq 1e4, ...). Every 6th layer is global.
    "google/gemma-3-270m": dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
        sliding_window=512, query_pre_attn_scalar=256, attn_logit_softcapping=None, final_logit_softcapping=None,
        tie_word_embeddings=True),
    "google/gemma-3-1b-it": dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
        sliding_window=512, query_pre_attn_scalar=256, attn_logit_softcapping=None, final_logit_softcapping=None),
    "google/gemma-3-4b-it": dict(
        model_type="gemma3_text", vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window=1024, query_pre_attn_scalar=256),
    "google/gemma-3-12b-it": dict(
        model_type="gemma3_text", vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window=1024, query_pre_attn_scalar=256),
    "google/gemma-3-27b-it": dict(
        model_type="gemma3_text", vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=dict(rope_type="linear", factor=8.0), sliding_window=1024, query_pre_attn_scalar=168),
    "Qwen/Qwen2-0.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2-7B-Instruct": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-7B-Instruct": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-14B": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-14B-Instruct": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-32B": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-32B-Instruct": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-72B": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen2.5-72B-Instruct": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-0.6B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-0.6B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-4B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-4B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=True),
    "Qwen/Qwen3-8B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-8B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-14B-Base": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-14B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-32B": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False),
    "Qwen/Qwen3-30B-A3B": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True),
    "Qwen/Qwen3-235B-A22B": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=94,
        num_attention_heads=64, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, tie_word_embeddings=False,
        moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True),
    # Llama 4: the text_config of each repo's config.json (model_type llama4, a vision model beside it);
    # intermediate_size is the experts' width, intermediate_size_mlp the dense layers'
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": dict(
        model_type="llama4_text", vocab_size=202048, hidden_size=5120, intermediate_size=8192,
        intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=10485760, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                          original_max_position_embeddings=8192),
        tie_word_embeddings=False, num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
        use_qk_norm=True, attention_chunk_size=8192),
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": dict(
        model_type="llama4_text", vocab_size=202048, hidden_size=5120, intermediate_size=8192,
        intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=1048576, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
        tie_word_embeddings=False, num_local_experts=128, num_experts_per_tok=1, interleave_moe_layer_step=2,
        use_qk_norm=False, attention_chunk_size=8192),
}
# fmt: on

# the config.json keys that name a hyperparameter read back from a built model (_read_hyperparameters)
HYPERPARAMETERS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_local_base_freq",
    "rope_scaling",
    "tie_word_embeddings",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
)
# the keys that decide the parameter count of a transformers model
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "pad_token_id",
    "moe_intermediate_size",
    "num_experts",
    "intermediate_size_mlp",  # Llama 4's dense layers
    "num_local_experts",
    "interleave_moe_layer_step",
)
# Llama 4's keys, checked in test_named_size_has_the_published_hyperparameters
LLAMA4_KEYS = ("intermediate_size_mlp", "num_local_experts", "interleave_moe_layer_step", "use_qk_norm",
               "attention_chunk_size")  # fmt: skip


def _one(values: list, what: str):
    assert len({repr(value) for value in values}) == 1, f"{what} differs between layers: {values}"
    return values[0]


def _read_hyperparameters(model: TransformerDecoder) -> dict:
    """The built model's hyperparameters under their config.json names, each checked to be the same everywhere."""
    attns = [layer.attn for layer in model.layers]
    # one module shared by every layer; Gemma 3's local (sliding-window) layers share one of their own
    # (Llama 4's NoPE layers have none)
    global_attns = [attn for attn in attns if attn.sliding_window is None and attn.pos_embeddings is not None] or attns
    rope = _one([attn.pos_embeddings for attn in global_attns], "the RoPE module")
    local_rope = _one(
        [attn.pos_embeddings for attn in attns if attn.sliding_window is not None] or [rope], "local RoPE"
    )
    rope_scaling = None
    if isinstance(rope, LinearScaledRoPE):
        rope_scaling = dict(rope_type="linear", factor=rope.scale_factor)
    if isinstance(rope, Llama3ScaledRoPE):
        rope_scaling = dict(
            rope_type="llama3",
            factor=rope.scale_factor,
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.old_context_len,
        )
    # sparse (MoE) layers have no dense feed-forward; an all-sparse model has no intermediate_size to read back
    dense = [layer.mlp.w1.out_features for layer in model.layers if hasattr(layer.mlp, "w1")]
    moes = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "experts")]
    max_seq_lens = [model.max_seq_len, rope.max_seq_len, local_rope.max_seq_len] + [attn.max_seq_len for attn in attns]
    return dict(
        vocab_size=model.tok_embeddings.num_embeddings,
        hidden_size=model.tok_embeddings.embedding_dim,
        intermediate_size=_one(dense, "intermediate size") if dense else None,
        num_hidden_layers=len(model.layers),
        num_attention_heads=_one([attn.num_heads for attn in attns], "num_heads"),
        num_key_value_heads=_one([attn.num_kv_heads for attn in attns], "num_kv_heads"),
        head_dim=_one([attn.head_dim for attn in attns], "head_dim"),
        max_position_embeddings=_one(max_seq_lens, "max_seq_len"),
        rms_norm_eps=_one([m.eps for m in model.modules() if isinstance(m, RMSNorm)], "RMSNorm eps"),
        rope_theta=rope.base,
        rope_local_base_freq=local_rope.base,
        rope_scaling=rope_scaling,
        tie_word_embeddings=isinstance(model.output, TiedLinear),
        attn_logit_softcapping=_one([attn.softcapping for attn in attns], "attention softcapping"),
        final_logit_softcapping=getattr(model.output, "softcapping", None),
        query_pre_attn_scalar=_one([attn.scale**-2 for attn in attns], "attention scale"),
        moe_intermediate_size=_one([m.experts.hidden_dim for m in moes], "expert width") if moes else None,
        num_experts=_one([m.experts.num_experts for m in moes], "num_experts") if moes else None,
        num_experts_per_tok=_one([m.router.experts_per_token for m in moes], "experts per token") if moes else None,
        norm_topk_prob=_one([m.router.norm_topk_prob for m in moes], "norm_topk_prob") if moes else None,
    )


def _published_sliding_windows(published: dict) -> list[int | None]:
    """The window of each layer of the transformers model of ``published`` (None: full attention)."""
    num_layers, window = published["num_hidden_layers"], published.get("sliding_window")
    if published["model_type"] in ("mistral", "phi3"):  # every layer
        return [window] * num_layers
    if published["model_type"] == "gemma2":  # local and global layers alternate, local first
        return [window if i % 2 == 0 else None for i in range(num_layers)]
    if published["model_type"] == "gemma3_text":  # five local layers, then a global one (layer_types)
        return [None if (i + 1) % 6 == 0 else window for i in range(num_layers)]
    if published["model_type"] in ("qwen2", "qwen3", "qwen3_moe"):
        assert published["use_sliding_window"] is False  # a window would apply from max_window_layers on
    return [None] * num_layers


def _same(ours, published) -> bool:
    if isinstance(published, int | float) and not isinstance(published, bool):
        # numbers read back through arithmetic (query_pre_attn_scalar is attention scale ** -2) agree to rounding
        return isinstance(ours, int | float) and math.isclose(ours, published, rel_tol=1e-9)
    return ours == published


def _builders(family: str) -> dict:
    """The family's registered builders."""
    return get_model_family(family).builders


def _build(name: str, prefix: str = "", *args, **kwargs) -> TransformerDecoder:
    """The registered builder ``prefix + name`` of size ``name``, called on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return _builders(SIZES[name][0])[prefix + name](*args, **kwargs)


def _callable_bare(builder) -> bool:
    return all(p.default is not inspect.Parameter.empty for p in inspect.signature(builder).parameters.values())


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts a tied weight once


@pytest.mark.parametrize("family", FAMILIES)
def test_family_registers_exactly_the_sizes_of_its_table(family):
    builders = _builders(family)
    named = {
        name
        for name, builder in builders.items()
        if not name.startswith(("lora_", "qlora_")) and "_reward_" not in name and _callable_bare(builder)
    }
    assert named == set(_table(family)), "named sizes (builders callable without arguments) are the rows of MODEL_SIZES"
    for name in _table(family):
        assert {f"lora_{name}", f"qlora_{name}"} <= set(builders)


def test_every_table_repo_has_published_values():
    core = {
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
    }
    repos = {size.repo for _, size in SIZES.values()}
    assert repos == set(PUBLISHED)
    print(f"{len(SIZES)} sizes in {len(DECODER_FAMILIES)} tables, {len(repos)} repos")
    for repo, published in PUBLISHED.items():
        assert core <= set(published), f"{repo} lacks {sorted(core - set(published))}"
        assert set(published) <= set(HYPERPARAMETERS) | {
            "model_type",
            "sliding_window",
            "use_sliding_window",
            "pad_token_id",
            *LLAMA4_KEYS,
        }


@pytest.mark.parametrize("name", sorted(SIZES))
def test_named_size_has_the_published_hyperparameters(name):
    published = PUBLISHED[SIZES[name][1].repo]
    model = _build(name)
    ours = _read_hyperparameters(model)
    compared = [key for key in HYPERPARAMETERS if key in published]
    if published["model_type"] == "llama4_text":
        _check_llama4(model, ours, published)
    if ours["intermediate_size"] is None:  # every layer sparse: the dense width is unused (and unreadable)
        compared.remove("intermediate_size")
    mismatched = {key: (ours[key], published[key]) for key in compared if not _same(ours[key], published[key])}
    assert not mismatched, f"{name}: (ours, published) {mismatched}"
    windows = [layer.attn.sliding_window for layer in model.layers]
    assert windows == _published_sliding_windows(published), f"{name}: per-layer sliding windows {windows}"


def _check_llama4(model: TransformerDecoder, ours: dict, published: dict) -> None:
    """Llama 4's own keys; ``ours["intermediate_size"]`` becomes the experts' width, as in its config.json."""
    dense_width, ours["intermediate_size"] = ours["intermediate_size"], ours["moe_intermediate_size"]
    assert dense_width in (None, published["intermediate_size_mlp"])
    assert ours["num_experts"] == published["num_local_experts"]
    sparse = [hasattr(layer.mlp, "experts") for layer in model.layers]
    step = published["interleave_moe_layer_step"]
    assert sparse == [(i + 1) % step == 0 for i in range(len(sparse))]
    rope_attns = [layer.attn for layer in model.layers if layer.attn.pos_embeddings is not None]
    assert len(rope_attns) == len(model.layers) * 3 // 4  # every 4th layer without RoPE (no_rope_layers: [])
    assert {attn.q_norm is not None for attn in rope_attns} == {published["use_qk_norm"]}
    assert {attn.attention_chunk_size for attn in rope_attns} == {published["attention_chunk_size"]}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_named_size_has_transformers_parameter_count(name):
    published = PUBLISHED[SIZES[name][1].repo]
    shape = {key: published[key] for key in SHAPE_KEYS if key in published}
    config = transformers.AutoConfig.for_model(published["model_type"], **shape)
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(config)
    assert _count(_build(name)) == _count(reference)


def _torchtune_api():
    """tools/torchtune_api.py (its signature check) and the torchtune 0.6.1 names it recorded."""
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("torchtune_api", root / "tools" / "torchtune_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    packages = json.loads((root / "tests" / "assets" / "torchtune_0_6_1_api.json").read_text())["packages"]
    return module, packages


@pytest.mark.parametrize("name", sorted(SIZES))
def test_lora_and_qlora_builders_keep_torchtune_signatures(name):
    builders = _builders(SIZES[name][0])
    base, lora, qlora = builders[name], builders[f"lora_{name}"], builders[f"qlora_{name}"]
    assert inspect.isfunction(base) and inspect.isfunction(lora) and base.__doc__ and lora.__doc__
    assert inspect.signature(qlora).return_annotation is inspect.signature(lora).return_annotation
    assert qlora.func is lora and qlora.args == () and qlora.keywords == {"quantize_base": True}
    assert inspect.signature(qlora).parameters["quantize_base"].default is True
    assert qlora.__name__ == qlora.__qualname__ == f"qlora_{name}"
    assert qlora.__module__ == lora.__module__ == base.__module__
    assert f"lora_{name}" in qlora.__doc__
    api, packages = _torchtune_api()
    theirs = packages.get(f"torchtune.models.{SIZES[name][0]}", {})
    for builder in (base, lora, qlora):
        if builder.__name__ in theirs:  # sizes torchtune 0.6.1 has (tune has more, e.g. Qwen3)
            assert api.signature_problems(theirs[builder.__name__]["params"], builder) == [], builder.__name__


@pytest.mark.parametrize("name", sorted(SIZES))
def test_named_lora_builder_adds_exactly_the_adapters(name):
    rank = 8
    base = _build(name)
    lora = _build(name, "lora_", ["q_proj", "v_proj"], apply_lora_to_mlp=True, lora_rank=rank)
    attn = base.layers[0].attn
    q_out, kv_out = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    embed_dim = attn.embed_dim
    per_layer = rank * (embed_dim + q_out) + rank * (embed_dim + kv_out)
    # apply_lora_to_mlp adapts the dense feed-forward layers and a sparse layer's shared expert (Llama 4), not its
    # routed experts
    ffns = [
        f for layer in base.layers for f in (layer.mlp, getattr(layer.mlp, "shared_expert", None)) if hasattr(f, "w1")
    ]
    mlp = [3 * rank * (embed_dim + ffn.w1.out_features) for ffn in ffns]
    assert _count(lora) == _count(base) + len(base.layers) * per_layer + sum(mlp)


def test_qlora_builder_is_validated_against_its_signature():
    component = "tune.models.qwen2_5.qlora_qwen2_5_0_5b"
    cfg = OmegaConf.create({"model": {"_component_": component, "lora_attn_modules": ["q_proj"], "lora_rank": 4}})
    assert validate_config(cfg) == []
    cfg.model.quantize_base = False  # accepted, as by torchtune's qlora_* partials
    assert validate_config(cfg) == []
    cfg.model.lora_rnak = 4
    assert [p.key for p in validate_config(cfg)] == ["model.lora_rnak"]


TINY_LLAMA = dict(
    vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, intermediate_dim=48, max_seq_len=16
)


def test_a_new_size_needs_a_table_row_and_its_lora_builder_is_generated():
    from tune.models._common import lora_size_builder
    from tune.models.llama3_2 import llama3_2, lora_llama3_2

    table = {"llama3_2_tiny": ModelSize("example/tiny", TINY_LLAMA)}

    def llama3_2_tiny(tie_word_embeddings: bool = True) -> TransformerDecoder:
        """A tiny Llama 3.2."""
        return llama3_2(**{**table["llama3_2_tiny"].dims, "tie_word_embeddings": tie_word_embeddings})

    lora_tiny = lora_size_builder(llama3_2_tiny, lora_llama3_2, table)
    assert inspect.isfunction(lora_tiny) and lora_tiny.__name__ == "lora_llama3_2_tiny"
    assert lora_tiny.__module__ == llama3_2_tiny.__module__ and "example/tiny" in lora_tiny.__doc__
    # torchtune's LoRA arguments, all positional or keyword, then the size builder's own
    assert str(inspect.signature(lora_tiny)) == str(inspect.signature(tune.models.llama3_2.lora_llama3_2_1b))
    torch.manual_seed(0)
    generated = lora_tiny(["q_proj", "v_proj"], True, False, 4, 8.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    direct = lora_llama3_2(
        ["q_proj", "v_proj"], True, False, lora_rank=4, lora_alpha=8.0, tie_word_embeddings=False, **TINY_LLAMA
    )
    expected = direct.state_dict()
    assert {key: value.shape for key, value in generated.state_dict().items()} == {
        key: value.shape for key, value in expected.items()
    }
    assert all(torch.equal(value, expected[key]) for key, value in generated.state_dict().items())
    with pytest.raises(TypeError, match=r"lora_llama3_2_tiny\(\): .*lora_rnak"):
        lora_tiny(["q_proj"], lora_rnak=4)


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_lora_component_builders_take_the_base_arguments_and_the_shared_lora_ones(family):
    from tune.models._common import _LORA_PARAMETERS

    builders = _builders(family)
    names = [name for name in builders if name.startswith("lora_") and name[len("lora_") :] in builders]
    pairs = [(name, builders[name[len("lora_") :]]) for name in names]
    pairs = [(name, base) for name, base in pairs if "vocab_size" in inspect.signature(base).parameters]
    assert pairs or family in ("code_llama2", "llama3_3", "phi4", "qwen2")  # these build with another's builders
    for name, base in pairs:
        lora = inspect.signature(builders[name]).parameters
        for param in inspect.signature(base).parameters.values():  # each base argument, keyword-only
            assert lora[param.name] == param.replace(kind=inspect.Parameter.KEYWORD_ONLY), (name, param.name)
        for param_name in set(lora) - set(inspect.signature(base).parameters):
            shared = _LORA_PARAMETERS[param_name]  # only LoRA arguments added, annotated as everywhere
            assert lora[param_name].annotation == shared.annotation, (name, param_name)
        positional = [p.name for p in lora.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert positional[0] == "lora_attn_modules" and set(positional) <= set(_LORA_PARAMETERS), name
