"""LayerDropout and prepare_layer_dropout: which rows run the layer, per-layer probabilities, state-dict keys."""

import math

import pytest
import torch
from torch import nn

from tune.modules import LayerDropout, ScaleType, prepare_layer_dropout


def test_kept_rows_run_the_layer_and_dropped_rows_pass_through():
    x = torch.randn(64, 3)
    dropout = LayerDropout(prob=0.5, seed=0)
    out = dropout(lambda rows: rows * 10.0, x)
    ran = (out == x * 10.0).all(dim=1)
    skipped = (out == x).all(dim=1)
    assert bool((ran ^ skipped).all())  # every row is one or the other
    assert 10 < int(ran.sum()) < 54  # about half
    assert dropout.inferred == pytest.approx(ran.float().mean().item())
    # the same seed draws the same rows; eval mode and prob 0 run every row
    torch.testing.assert_close(LayerDropout(prob=0.5, seed=0)(lambda rows: rows * 10.0, x), out)
    assert torch.equal(LayerDropout(prob=0.5).eval()(lambda rows: rows * 10.0, x), x * 10.0)
    assert torch.equal(LayerDropout(prob=1.0)(lambda rows: rows * 10.0, x), x)
    with pytest.raises(ValueError, match="dim 0"):
        LayerDropout(prob=0.5, dim=1)


def test_prepare_layer_dropout_scales_probabilities_and_keeps_state_dict_keys():
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(5))
    before = {f"layers.{k}": v.clone() for k, v in layers.state_dict().items()}
    prepare_layer_dropout(layers, prob_max=0.4, prob_layer_scale=ScaleType.LINEAR, layers_str="1:")
    assert [layer.dropout.prob for layer in layers] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert layers[2].weight is layers[2].module.weight  # attributes read through the wrapper
    holder = nn.Module()
    holder.layers = layers
    assert holder.state_dict().keys() == before.keys()  # no `module.` level
    holder.load_state_dict({k: torch.zeros_like(v) for k, v in before.items()})
    assert all(torch.equal(layer.module.weight, torch.zeros(4, 4)) for layer in layers)
    exp = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    prepare_layer_dropout(exp, prob_max=0.2, prob_layer_scale=ScaleType.EXP, layers_str="0,2")
    assert [layer.dropout.prob for layer in exp] == pytest.approx([0.0, 0.0, 0.2])
    assert exp[1].dropout.prob == 0.0 and math.isclose(exp[2].dropout.prob, 0.2)
