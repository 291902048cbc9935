"""tune/training/_parallel.py: the tensor-parallel plan and the FSDP units a model family registers
(`family_tensor_parallel_plan`, `family_shard_conditions`)."""

import pytest
from torch import nn

from tune import registry
from tune.models._parallel import base_llama_tp_plan
from tune.models.llama3_2 import llama3_2
from tune.modules import TransformerSelfAttentionLayer
from tune.training import family_shard_conditions, family_tensor_parallel_plan

TINY = dict(vocab_size=32, num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=16,
            intermediate_dim=32, tie_word_embeddings=False)  # fmt: skip


@pytest.fixture
def model() -> nn.Module:
    return llama3_2(**TINY)


def test_the_family_plan_by_model_type(model):
    plan = family_tensor_parallel_plan(model, "LLAMA3_2")  # torchtune's spelling of checkpointer.model_type
    expected = base_llama_tp_plan(model)  # what tune/models/llama3_2 registers as tp_plan
    assert sorted(plan) == sorted(expected)
    assert all(type(plan[k]) is type(expected[k]) for k in expected)


@pytest.mark.parametrize("model_type", ["GEMMA2", None], ids=["no_plan", "no_model_type"])
def test_a_family_without_a_plan_raises_naming_the_model_type(model, model_type):
    with pytest.raises(ValueError) as info:
        family_tensor_parallel_plan(model, model_type)
    assert str(info.value) == (
        f"the model family {model_type!r} (checkpointer.model_type) registers no tensor-parallel plan. Set "
        "tensor_parallel_dim: 1, or name a plan under tensor_parallel_plan"
    )


def test_an_unknown_model_type_raises_naming_it(model):
    with pytest.raises(ValueError, match="Unknown model_type 'LLAMA9'"):
        family_tensor_parallel_plan(model, "LLAMA9")


def test_without_a_family_every_transformer_layer_is_a_unit(model):
    assert family_shard_conditions(model, None) == [TransformerSelfAttentionLayer]
    assert family_shard_conditions(model, "LLAMA3_2") == [TransformerSelfAttentionLayer]  # registers no rule


def test_a_family_rule_names_the_units(model, monkeypatch):
    family = registry.ModelFamily(name="two_units", fsdp_shard_modules=lambda m: [m.layers[0], m.output])
    monkeypatch.setitem(registry._FAMILIES, "two_units", family)
    (condition,) = family_shard_conditions(model, "TWO_UNITS")
    units = [name for name, module in model.named_modules() if condition(name, module)]
    assert units == ["layers.0", "output"]
