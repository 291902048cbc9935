"""Every named size, built on the meta device, has exactly the parameter count of the transformers model built
from the official config.json values of that size (written below as literals, each naming its Hugging Face repo).
"""

import pytest
import torch

from tune.registry import get_model_family

transformers = pytest.importorskip("transformers")


def _llama(vocab, hidden, inter, layers, heads, kv, **extra):
    return "LlamaConfig", dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, **extra,
    )


def _qwen2(vocab, hidden, inter, layers, heads, kv, tie):
    return "Qwen2Config", dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tie,
    )


def _qwen3(hidden, inter, layers, heads, tie):
    return "Qwen3Config", dict(
        vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=8, head_dim=128, tie_word_embeddings=tie,
    )


def _gemma2(hidden, inter, layers, heads, kv, head_dim):
    return "Gemma2Config", dict(
        vocab_size=256000, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
    )


# builder -> (family, transformers config class, config.json values)
OFFICIAL = {
    # meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Llama-2-70b-hf
    "llama2_7b": ("llama2", *_llama(32000, 4096, 11008, 32, 32, 32)),
    "llama2_13b": ("llama2", *_llama(32000, 5120, 13824, 40, 40, 40)),
    "llama2_70b": ("llama2", *_llama(32000, 8192, 28672, 80, 64, 8)),
    # meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B
    "llama3_8b": ("llama3", *_llama(128256, 4096, 14336, 32, 32, 8)),
    "llama3_70b": ("llama3", *_llama(128256, 8192, 28672, 80, 64, 8)),
    # meta-llama/Llama-3.1-8B, Llama-3.1-70B, Llama-3.1-405B
    "llama3_1_8b": ("llama3_1", *_llama(128256, 4096, 14336, 32, 32, 8)),
    "llama3_1_70b": ("llama3_1", *_llama(128256, 8192, 28672, 80, 64, 8)),
    "llama3_1_405b": ("llama3_1", *_llama(128256, 16384, 53248, 126, 128, 8)),
    # meta-llama/Llama-3.2-1B, Llama-3.2-3B (tied embeddings, head_dim 64 / 128)
    "llama3_2_1b": ("llama3_2", *_llama(128256, 2048, 8192, 16, 32, 8, head_dim=64, tie_word_embeddings=True)),
    "llama3_2_3b": ("llama3_2", *_llama(128256, 3072, 8192, 28, 24, 8, head_dim=128, tie_word_embeddings=True)),
    # meta-llama/Llama-3.3-70B-Instruct
    "llama3_3_70b": ("llama3_3", *_llama(128256, 8192, 28672, 80, 64, 8)),
    # mistralai/Mistral-7B-v0.1
    "mistral_7b": ("mistral", "MistralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, sliding_window=4096,
    )),
    # Qwen/Qwen2.5-0.5B-Instruct, -1.5B, -3B-Instruct, -7B, -14B, -32B, -72B (base and -Instruct share dimensions)
    "qwen2_5_0_5b": ("qwen2_5", *_qwen2(151936, 896, 4864, 24, 14, 2, True)),
    "qwen2_5_1_5b_base": ("qwen2_5", *_qwen2(151936, 1536, 8960, 28, 12, 2, True)),
    "qwen2_5_1_5b_instruct": ("qwen2_5", *_qwen2(151936, 1536, 8960, 28, 12, 2, True)),
    "qwen2_5_3b": ("qwen2_5", *_qwen2(151936, 2048, 11008, 36, 16, 2, True)),
    "qwen2_5_7b_base": ("qwen2_5", *_qwen2(152064, 3584, 18944, 28, 28, 4, False)),
    "qwen2_5_7b_instruct": ("qwen2_5", *_qwen2(152064, 3584, 18944, 28, 28, 4, False)),
    "qwen2_5_14b_base": ("qwen2_5", *_qwen2(152064, 5120, 13824, 48, 40, 8, False)),
    "qwen2_5_14b_instruct": ("qwen2_5", *_qwen2(152064, 5120, 13824, 48, 40, 8, False)),
    "qwen2_5_32b_base": ("qwen2_5", *_qwen2(152064, 5120, 27648, 64, 40, 8, False)),
    "qwen2_5_32b_instruct": ("qwen2_5", *_qwen2(152064, 5120, 27648, 64, 40, 8, False)),
    "qwen2_5_72b_base": ("qwen2_5", *_qwen2(152064, 8192, 29568, 80, 64, 8, False)),
    "qwen2_5_72b_instruct": ("qwen2_5", *_qwen2(152064, 8192, 29568, 80, 64, 8, False)),
    # Qwen/Qwen3-0.6B(-Base), 1.7B, 4B, 8B, 14B, 32B
    "qwen3_0_6b_base": ("qwen3", *_qwen3(1024, 3072, 28, 16, True)),
    "qwen3_0_6b_instruct": ("qwen3", *_qwen3(1024, 3072, 28, 16, True)),
    "qwen3_1_7b_base": ("qwen3", *_qwen3(2048, 6144, 28, 16, True)),
    "qwen3_1_7b_instruct": ("qwen3", *_qwen3(2048, 6144, 28, 16, True)),
    "qwen3_4b_base": ("qwen3", *_qwen3(2560, 9728, 36, 32, True)),
    "qwen3_4b_instruct": ("qwen3", *_qwen3(2560, 9728, 36, 32, True)),
    "qwen3_8b_base": ("qwen3", *_qwen3(4096, 12288, 36, 32, False)),
    "qwen3_8b_instruct": ("qwen3", *_qwen3(4096, 12288, 36, 32, False)),
    "qwen3_14b_base": ("qwen3", *_qwen3(5120, 17408, 40, 40, False)),
    "qwen3_14b_instruct": ("qwen3", *_qwen3(5120, 17408, 40, 40, False)),
    "qwen3_32b": ("qwen3", *_qwen3(5120, 25600, 64, 64, False)),
    # google/gemma-2-2b, gemma-2-9b, gemma-2-27b
    "gemma2_2b": ("gemma2", *_gemma2(2304, 9216, 26, 8, 4, 256)),
    "gemma2_9b": ("gemma2", *_gemma2(3584, 14336, 42, 16, 8, 256)),
    "gemma2_27b": ("gemma2", *_gemma2(4608, 36864, 46, 32, 16, 128)),
    # microsoft/Phi-3-mini-4k-instruct
    "phi3_mini": ("phi3", "Phi3Config", dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, pad_token_id=32000, sliding_window=2047,
    )),
}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts a tied weight once


# component builders (take dimensions) are registered beside the named sizes
COMPONENT_BUILDERS = {"llama2", "llama3", "llama3_1", "llama3_2", "mistral", "qwen2", "qwen3", "gemma2", "phi3"}


def test_every_named_size_is_checked():
    named = set()
    for family in {family for family, *_ in OFFICIAL.values()}:
        named |= {
            name
            for name in get_model_family(family).builders
            if not name.startswith(("lora_", "qlora_")) and name not in COMPONENT_BUILDERS
        }
    assert named == set(OFFICIAL)


@pytest.mark.parametrize("builder_name", sorted(OFFICIAL))
def test_named_size_has_transformers_parameter_count(builder_name):
    family, config_class, values = OFFICIAL[builder_name]
    with torch.device("meta"):
        ours = get_model_family(family).builders[builder_name]()
        reference = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**values))
    assert _count(ours) == _count(reference)
