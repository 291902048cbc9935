"""FrozenNF4Linear against F.linear on its dequantised weight, and the NF4-to-dense state-dict hook."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("torchao")

from tune.modules import FrozenNF4Linear, reparametrize_as_dtype_state_dict_post_hook  # noqa: E402
from tune.modules.low_precision import dequantize, is_nf4_tensor  # noqa: E402


def test_frozen_nf4_linear_computes_linear_on_the_dequantised_weight_and_trains_only_its_input():
    torch.manual_seed(0)
    layer = FrozenNF4Linear(64, 32, bias=True)
    assert is_nf4_tensor(layer.weight) and not layer.weight.requires_grad and not layer.bias.requires_grad
    x = torch.randn(3, 64, requires_grad=True)
    out = layer(x)
    x_ref = x.detach().clone().requires_grad_(True)
    reference = F.linear(x_ref, dequantize(layer.weight), layer.bias)
    torch.testing.assert_close(out, reference)
    out.sum().backward()
    reference.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_block_sizes_are_passed_to_torchao_and_used_again_for_a_loaded_dense_weight():
    layer = FrozenNF4Linear(64, 8, block_size=32, scaler_block_size=4)
    assert (layer.weight.block_size, layer.weight.scaler_block_size) == (32, 4)
    dense = torch.randn(8, 64)
    layer.load_state_dict({"weight": dense})
    assert is_nf4_tensor(layer.weight) and layer.weight.block_size == 32
    assert (dequantize(layer.weight) - dense).abs().max() < 0.5 * dense.abs().max()


def test_state_dict_hook_writes_nf4_weights_as_dense_tensors_of_the_asked_dtype():
    model = nn.Sequential(FrozenNF4Linear(64, 16), nn.Linear(16, 4))
    model._register_state_dict_hook(partial(reparametrize_as_dtype_state_dict_post_hook, dtype=torch.bfloat16))
    state = model.state_dict()
    assert not is_nf4_tensor(state["0.weight"]) and state["0.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(state["0.weight"], dequantize(model[0].weight).to(torch.bfloat16))
    assert state["1.weight"].dtype == torch.float32  # not NF4: left alone
