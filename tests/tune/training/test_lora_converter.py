"""LoRAConverter (tune/training/_model_converters.py): LoRA from `model_converters:` on a model built without it."""

import pytest
import torch
from torch import nn

from tune.modules.peft import LoRALinear, get_adapter_config
from tune.training._model_converters import (
    Int8DynActInt4WeightQATConverter,
    LoRAConverter,
    apply_model_converters,
    validate_converter_order,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_convert_adapts_matching_layers_freezes_the_rest_and_keeps_outputs():
    model = _model()
    x = torch.randn(3, 8)
    before = model(x)
    model = apply_model_converters(model, [LoRAConverter(target_modules="0", rank=2, alpha=4.0)])
    assert isinstance(model[0], LoRALinear) and type(model[2]) is nn.Linear
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"0.lora_a.weight", "0.lora_b.weight"}
    assert get_adapter_config(model) == {"r": 2, "lora_alpha": 4.0, "lora_dropout": 0.0}
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # B starts at zero


def test_peft_kind_must_come_before_qat():
    validate_converter_order([LoRAConverter, Int8DynActInt4WeightQATConverter])
    with pytest.raises(ValueError, match="LoRAConverter.*must run before"):
        validate_converter_order([Int8DynActInt4WeightQATConverter, LoRAConverter])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_modules=[], rank=8, alpha=16), "target_modules must be"),
        (dict(target_modules=["q_proj"], rank=0, alpha=16), "rank must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRAConverter(**kwargs)


def test_no_matching_layer_lists_the_linear_layers():
    with pytest.raises(ValueError, match="no nn.Linear layer.*Its 2 nn.Linear layer"):
        LoRAConverter(target_modules=["q_proj"], rank=2, alpha=4.0).convert(_model())
