"""TanhGate: closed at initialisation, then x * tanh(scale)."""

import torch

from tune.modules import TanhGate


def test_tanh_gate_starts_closed_and_scales_by_tanh_of_its_parameter():
    gate = TanhGate()
    x = torch.randn(2, 3, 4)
    assert list(gate.state_dict()) == ["scale"] and torch.equal(gate(x), torch.zeros_like(x))
    with torch.no_grad():
        gate.scale.fill_(0.5)
    torch.testing.assert_close(gate(x), x * torch.tanh(torch.tensor(0.5)))
