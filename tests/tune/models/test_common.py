"""The pieces of tune/models/_common.py that model-size tables use: ``ModelSize`` rows and ``qlora_builder``."""

import dataclasses
import functools
import inspect

import pytest
import torch

from tune.models._common import ModelSize, qlora_builder


def test_model_size_is_frozen_with_read_only_dims():
    dims = {"num_layers": 2, "embed_dim": 64}
    size = ModelSize("org/model", dims)
    dims["num_layers"] = 3  # the row kept its own copy
    assert size.dims == {"num_layers": 2, "embed_dim": 64}
    with pytest.raises(TypeError):
        size.dims["num_layers"] = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        size.repo = "other/model"


def lora_toy(lora_attn_modules: list[str], lora_rank: int = 8, quantize_base: bool = False) -> tuple:
    """A LoRA builder's shape: adapted modules, rank, and quantize_base last."""
    return lora_attn_modules, lora_rank, quantize_base


def test_qlora_builder_is_a_documented_partial_with_quantize_base_keyword_only():
    qlora_toy = qlora_builder(lora_toy)
    assert isinstance(qlora_toy, functools.partial) and qlora_toy.func is lora_toy
    assert qlora_toy(["q_proj"], 4) == (["q_proj"], 4, True)
    assert qlora_toy(["q_proj"], lora_rank=2) == (["q_proj"], 2, True)
    assert (qlora_toy.__name__, qlora_toy.__qualname__, qlora_toy.__module__) == ("qlora_toy", "qlora_toy", __name__)
    assert "lora_toy" in qlora_toy.__doc__ and "quantize_base=True" in qlora_toy.__doc__
    assert inspect.getdoc(qlora_toy) == inspect.cleandoc(qlora_toy.__doc__)
    signature = inspect.signature(qlora_toy)
    # as torchtune's qlora_* partials show it: quantize_base keyword-only, default True
    assert (
        str(signature) == "(lora_attn_modules: list[str], lora_rank: int = 8, *, quantize_base: bool = True) -> tuple"
    )
    assert qlora_toy(["q_proj"], quantize_base=False) == (["q_proj"], 8, False)
    with pytest.raises(TypeError):  # quantize_base is not positional any more
        qlora_toy(["q_proj"], 4, False)


def test_qlora_builder_needs_a_quantize_base_parameter():
    def lora_without(lora_attn_modules: list[str]) -> None:
        """No quantize_base."""

    with pytest.raises(TypeError, match="quantize_base"):
        qlora_builder(lora_without)


def test_llama_intermediate_dim_gives_the_published_llama2_widths():
    from tune.models._common import llama_intermediate_dim

    # intermediate_size in the config.json of meta-llama/Llama-2-7b-hf and Llama-2-13b-hf
    assert llama_intermediate_dim(4096) == 11008
    assert llama_intermediate_dim(5120) == 13824


def test_component_builders_take_torchtune_positional_order_and_default_width():
    from tune.models.llama2 import llama2
    from tune.models.llama3 import llama3

    with torch.device("meta"):
        # torchtune: (vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, attn_dropout,
        # [rope_base,] intermediate_dim, norm_eps)
        model = llama3(64, 1, 4, 2, 32, 16, 0.0, 1234.0, 48, 1e-6)
        default = llama2(64, 1, 4, 4, 512, 16)
    assert model.layers[0].mlp.w1.out_features == 48
    assert model.layers[0].attn.pos_embeddings.base == 1234.0
    assert model.norm.eps == 1e-6
    assert default.layers[0].mlp.w1.out_features == 1536  # 4 * int(2 * 512 / 3) = 1364, rounded up to 256s


def test_llama3_2_sizes_can_untie_the_output():
    from tune.models.llama3_2 import llama3_2_1b, lora_llama3_2_1b
    from tune.modules import TiedLinear

    with torch.device("meta"):
        tied, untied = llama3_2_1b(), llama3_2_1b(tie_word_embeddings=False)
        lora = lora_llama3_2_1b(["q_proj"], apply_lora_to_output=True, tie_word_embeddings=False)
    assert isinstance(tied.output, TiedLinear)
    assert isinstance(untied.output, torch.nn.Linear) and untied.output.weight.shape == (128256, 2048)
    assert hasattr(lora.output, "lora_a")
