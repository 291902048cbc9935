"""compile_model / compile_loss: compiled modules give the eager results (aot_eager keeps the test fast)."""

import torch
from torch import nn

from tune.modules.loss import LinearCrossEntropyLoss
from tune.training import compile_loss, compile_model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        self.output = nn.Linear(8, 16, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_compile_model_compiles_each_layer_with_unchanged_outputs_and_names():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(3, 8)
    want = model(x)
    keys = list(model.state_dict())
    assert compile_model(model, backend="aot_eager") == 2
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    torch.testing.assert_close(model(x), want)
    assert list(model.state_dict()) == keys


def test_compile_model_falls_back_to_the_whole_model():
    model = nn.Sequential(nn.Linear(4, 4))
    assert compile_model(model, backend="eager") == 1
    assert model._compiled_call_impl is not None


def test_compile_loss_keeps_loss_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(2, 6, 8, requires_grad=True)
    labels = torch.randint(0, 16, (2, 6))
    labels[1, 4:] = -100
    model = Net()
    eager = LinearCrossEntropyLoss(num_output_chunks=2)
    eager.set_model_output(model)
    want = eager(hidden, labels)
    (want_grad,) = torch.autograd.grad(want, hidden)
    compiled = compile_loss(LinearCrossEntropyLoss(num_output_chunks=2), backend="aot_eager")
    compiled.set_model_output(model)
    got = compiled(hidden, labels)
    (got_grad,) = torch.autograd.grad(got, hidden)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
