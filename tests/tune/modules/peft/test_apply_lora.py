"""apply_lora on models that are not tune's: matching by name, weight takeover, freezing, training."""

import re

import pytest
import torch
from torch import nn

from tune.modules.peft import DoRALinear, LoRALinear, apply_lora, get_adapter_params, is_nf4_tensor


class UserMLP(nn.Module):
    """A model a user might write: nested blocks, biases, a non-linear layer in between."""

    def __init__(self, dim: int = 16, hidden: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict({"w1": nn.Linear(dim, hidden), "w2": nn.Linear(hidden, dim)}) for _ in range(num_layers)
        )
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = x + block["w2"](torch.relu(block["w1"](x)))
        return self.head(x)


def _replaced(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, (LoRALinear, DoRALinear))]


@pytest.mark.parametrize(
    "targets, expected",
    [
        ("head", ["head"]),  # exact name
        (["w1"], ["layers.0.w1", "layers.1.w1"]),  # dotted suffix
        ("layers.*.w2", ["layers.0.w2", "layers.1.w2"]),  # glob
        ("1.w*", ["layers.1.w1", "layers.1.w2"]),  # glob over a dotted suffix
        (r"layers\.0\.w[12]", ["layers.0.w1", "layers.0.w2"]),  # regular expression over the full name
        (re.compile(r".*\.w1|head"), ["layers.0.w1", "layers.1.w1", "head"]),  # compiled pattern
    ],
)
def test_target_patterns(targets, expected):
    model = apply_lora(UserMLP(), targets, rank=2, alpha=4.0)
    assert _replaced(model) == expected


def test_weights_are_taken_over_and_output_is_unchanged():
    torch.manual_seed(0)
    model = UserMLP()
    x = torch.randn(5, 16)
    before = model(x)
    w1 = model.layers[0]["w1"].weight.detach().clone()
    apply_lora(model, ["w1", "w2", "head"], rank=2, alpha=4.0)
    assert torch.equal(model.layers[0]["w1"].weight, w1)
    assert torch.equal(model(x), before)  # B = 0 reproduces the base exactly
    assert set(model.state_dict()) >= set(UserMLP().state_dict())


def test_training_changes_only_adapters():
    torch.manual_seed(0)
    model = apply_lora(UserMLP(), ["w1", "w2"], rank=4, alpha=8.0, dropout=0.1)
    adapters = get_adapter_params(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(adapters)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x, y = torch.randn(32, 16), torch.randint(0, 3, (32,))
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    for name, param in model.named_parameters():
        changed = not torch.equal(param, before[name])
        assert changed == (name in adapters), name
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("use_dora, quantize_base", [(True, False), (False, True), (True, True)])
def test_dora_and_qlora_variants_train_only_adapters(use_dora, quantize_base):
    torch.manual_seed(0)
    model = apply_lora(UserMLP(), ["w1", "w2"], rank=4, alpha=8.0, use_dora=use_dora, quantize_base=quantize_base)
    layer = model.layers[0]["w1"]
    assert isinstance(layer, DoRALinear if use_dora else LoRALinear)
    assert is_nf4_tensor(layer.weight) == quantize_base
    model(torch.randn(8, 16)).sum().backward()
    for name, param in model.named_parameters():
        assert (param.grad is not None) == (name in get_adapter_params(model)), name


def test_dtype_and_meta_device_are_kept():
    model = apply_lora(UserMLP().to(torch.bfloat16), "w1", rank=2, alpha=4.0)
    layer = model.layers[0]["w1"]
    assert layer.weight.dtype == layer.lora_a.weight.dtype == torch.bfloat16
    with torch.device("meta"):
        meta_model = UserMLP()
    apply_lora(meta_model, "w1", rank=2, alpha=4.0, use_dora=True)
    assert all(p.device.type == "meta" for p in meta_model.parameters())


def test_no_match_lists_available_layers():
    expected = r"5 nn.Linear layer\(s\): layers.0.w1, layers.0.w2, layers.1.w1, layers.1.w2, head"
    with pytest.raises(ValueError, match=expected):
        apply_lora(UserMLP(), "q_proj", rank=2, alpha=4.0)


def test_bad_targets_and_bare_linear():
    with pytest.raises(TypeError, match="target_modules"):
        apply_lora(UserMLP(), [], rank=2, alpha=4.0)
    with pytest.raises(TypeError, match="bare nn.Linear"):
        apply_lora(nn.Linear(4, 4), ".*", rank=2, alpha=4.0)


def test_linear_subclasses_are_left_alone():
    # nn.MultiheadAttention reads out_proj.weight directly, so swapping its (subclass) out_proj would break it.
    model = nn.ModuleDict({"attn": nn.MultiheadAttention(16, 2), "proj": nn.Linear(16, 16)})
    apply_lora(model, [".*"], rank=2, alpha=4.0)
    assert _replaced(model) == ["proj"]
