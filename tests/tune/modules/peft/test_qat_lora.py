"""QATLoRALinear: its base path equals torchao's FakeQuantizedLinear with the same configs; the update is LoRA's."""

import pytest
import torch

from tune.modules.peft import LoRALinear, QATLoRALinear

qat = pytest.importorskip("torchao.quantization.qat")


def _configs():
    activation = qat.IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weight = qat.IntxFakeQuantizeConfig(torch.int4, group_size=32, is_symmetric=True)
    return activation, weight


def test_base_path_is_torchao_fake_quantized_linear_and_adapters_add_the_lora_update():
    torch.manual_seed(0)
    activation, weight = _configs()
    layer = QATLoRALinear(64, 16, rank=4, alpha=8.0, activation_qat_config=activation, weight_qat_config=weight)
    reference = qat.FakeQuantizedLinear(64, 16, activation_config=activation, weight_config=weight)
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        torch.nn.init.normal_(layer.lora_b.weight)
    x = torch.randn(2, 5, 64)
    update = (x @ layer.lora_a.weight.T @ layer.lora_b.weight.T) * (8.0 / 4)
    torch.testing.assert_close(layer(x), reference(x) + update)
    assert not torch.allclose(reference(x), x @ layer.weight.T, atol=1e-3)  # the quantisation does something
    layer(x).sum().backward()
    assert layer.lora_a.weight.grad is not None and layer.weight.grad is None
    layer.disabled = True
    torch.testing.assert_close(layer(x), reference(x))


def test_from_lora_linear_shares_parameters_and_checks_arguments():
    lora = LoRALinear(64, 16, rank=4, alpha=8.0)
    layer = QATLoRALinear.from_lora_linear(lora, weight_qat_config=_configs()[1])
    assert layer.weight is lora.weight and layer.lora_b.weight is lora.lora_b.weight
    with pytest.raises(ValueError, match="group_size"):
        QATLoRALinear(48, 16, rank=4, alpha=8.0, weight_qat_config=_configs()[1])
    with pytest.raises(TypeError, match="fake-quantize config"):
        QATLoRALinear(64, 16, rank=4, alpha=8.0, weight_qat_config="int4")
    with pytest.raises(ValueError, match="without bias"):
        QATLoRALinear.from_lora_linear(LoRALinear(64, 16, rank=4, alpha=8.0, use_bias=True))
