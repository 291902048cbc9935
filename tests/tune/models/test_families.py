"""Every built-in family is registered with its builders, converters, Hugging Face types and torchtune aliases."""

import pytest
import torch

from tests._helpers import BUILT_IN_FAMILIES
from tune.models._hf import hf_sliding_windows
from tune.registry import family_for_hf_model_type, get_model_family, list_model_families


def test_all_families_registered_with_converters():
    families = list_model_families()
    assert set(BUILT_IN_FAMILIES) <= set(families)
    for name in BUILT_IN_FAMILIES:
        family = families[name]
        assert family.hf_to_tune is not None and family.tune_to_hf is not None
        assert family.hf_model_types
        assert any(b.startswith("lora_") for b in family.builders)
        assert any(b.startswith("qlora_") for b in family.builders)


@pytest.mark.parametrize(
    "torchtune_model_type, family",
    [
        ("LLAMA2", "llama2"),
        ("LLAMA3", "llama3"),
        ("LLAMA3_2", "llama3_2"),
        ("MISTRAL", "mistral"),
        ("QWEN2", "qwen2"),
        ("QWEN2_5", "qwen2_5"),
        ("QWEN3", "qwen3"),
        ("GEMMA", "gemma"),
        ("GEMMA2", "gemma2"),
        ("GEMMA3", "gemma3"),
        ("PHI3_MINI", "phi3"),
        ("PHI4", "phi4"),
    ],
)
def test_torchtune_model_type_names_resolve(torchtune_model_type, family):
    assert get_model_family(torchtune_model_type).name == family


@pytest.mark.parametrize(
    "hf_type, family",
    [
        ("llama", "llama2"),
        ("mistral", "mistral"),
        ("qwen2", "qwen2_5"),
        ("qwen3", "qwen3"),
        ("qwen3_moe", "qwen3_moe"),
        ("llama4_text", "llama4"),
        ("llama4", "llama4"),
        ("gemma", "gemma"),
        ("gemma2", "gemma2"),
        ("gemma3_text", "gemma3"),
        # a multimodal checkpoint loads whole (the gemma3 family reads its language model when a checkpointer
        # names model_type GEMMA3)
        ("gemma3", "gemma3_vision"),
        ("phi3", "phi3"),
    ],
)
def test_each_hf_model_type_has_one_loader(hf_type, family):
    assert family_for_hf_model_type(hf_type).name == family


def test_llama_loader_builds_every_generation_from_config():
    loader = get_model_family("llama2").from_hf_config
    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    with torch.device("meta"):
        llama2 = loader({**base, "rope_theta": 10000.0})
        llama3_2 = loader(
            {
                **base,
                "rope_theta": 500000.0,
                "tie_word_embeddings": True,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            }
        )
    assert type(llama2.layers[0].attn.pos_embeddings).__name__ == "RotaryPositionalEmbeddings"
    assert type(llama3_2.layers[0].attn.pos_embeddings).__name__ == "Llama3ScaledRoPE"
    assert type(llama3_2.output).__name__ == "TiedLinear"
    with pytest.raises(ValueError, match="'yarn'.*supported: default"):
        loader({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="attention_bias"):
        loader({**base, "attention_bias": True})


def test_sliding_window_patterns():
    config = {"num_hidden_layers": 4, "sliding_window": 8}
    assert hf_sliding_windows(config, "even") == [8, None, 8, None]
    assert hf_sliding_windows(config, "all") == [8] * 4
    assert hf_sliding_windows(config, "qwen") == [None] * 4  # use_sliding_window is off
    assert hf_sliding_windows({**config, "use_sliding_window": True, "max_window_layers": 2}, "qwen") == [
        None,
        None,
        8,
        8,
    ]
    layer_types = ["full_attention", "sliding_attention", "full_attention", "full_attention"]
    assert hf_sliding_windows({**config, "layer_types": layer_types}, "even") == [None, 8, None, None]
