import pytest
import torch
from torch import nn

from tune.modules import FeedForward

transformers = pytest.importorskip("transformers")


def _copy(ours: FeedForward, reference: nn.Module) -> None:
    with torch.no_grad():
        ours.w1.weight.copy_(reference.gate_proj.weight)
        ours.w2.weight.copy_(reference.down_proj.weight)
        ours.w3.weight.copy_(reference.up_proj.weight)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_matches_transformers_mlp(family):
    torch.manual_seed(0)
    if family == "llama":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP as MLP

        config, activation = LlamaConfig(hidden_size=12, intermediate_size=20, num_attention_heads=2), nn.SiLU()
    else:
        from transformers import Gemma2Config
        from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP as MLP

        config = Gemma2Config(hidden_size=12, intermediate_size=20, num_attention_heads=2)
        activation = nn.GELU(approximate="tanh")
    reference = MLP(config)
    ours = FeedForward(
        gate_proj=nn.Linear(12, 20, bias=False),
        down_proj=nn.Linear(20, 12, bias=False),
        up_proj=nn.Linear(12, 20, bias=False),
        activation=activation,
    )
    _copy(ours, reference)
    x = torch.randn(3, 4, 12)
    assert torch.equal(ours(x), reference(x))


def test_ungated_feed_forward():
    ff = FeedForward(gate_proj=nn.Linear(4, 8), down_proj=nn.Linear(8, 4))
    x = torch.randn(2, 4)
    assert torch.allclose(ff(x), ff.w2(torch.nn.functional.silu(ff.w1(x))))


def test_default_activation_is_silu_and_not_shared_between_blocks():
    first = FeedForward(gate_proj=nn.Linear(4, 8), down_proj=nn.Linear(8, 4), up_proj=nn.Linear(4, 8))
    second = FeedForward(gate_proj=nn.Linear(4, 8), down_proj=nn.Linear(8, 4))
    assert isinstance(first.activation, nn.SiLU) and first.activation is not second.activation
