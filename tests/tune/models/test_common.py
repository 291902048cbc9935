"""The pieces of tune/models/_common.py that model-size tables use: ``ModelSize`` rows and ``qlora_builder``."""

import dataclasses
import functools
import inspect

import pytest

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


def test_qlora_builder_is_a_documented_partial_without_quantize_base():
    qlora_toy = qlora_builder(lora_toy)
    assert isinstance(qlora_toy, functools.partial) and qlora_toy.func is lora_toy
    assert qlora_toy(["q_proj"], 4) == (["q_proj"], 4, True)
    assert qlora_toy(["q_proj"], lora_rank=2) == (["q_proj"], 2, True)
    assert (qlora_toy.__name__, qlora_toy.__qualname__, qlora_toy.__module__) == ("qlora_toy", "qlora_toy", __name__)
    assert "lora_toy" in qlora_toy.__doc__ and "quantize_base=True" in qlora_toy.__doc__
    assert inspect.getdoc(qlora_toy) == inspect.cleandoc(qlora_toy.__doc__)
    signature = inspect.signature(qlora_toy)
    assert str(signature) == "(lora_attn_modules: list[str], lora_rank: int = 8) -> tuple"
    with pytest.raises(TypeError):  # one positional more than the signature shows: as for a function
        qlora_toy(["q_proj"], 4, False)


def test_qlora_builder_needs_a_quantize_base_parameter():
    def lora_without(lora_attn_modules: list[str]) -> None:
        """No quantize_base."""

    with pytest.raises(TypeError, match="quantize_base"):
        qlora_builder(lora_without)
