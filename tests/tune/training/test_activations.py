"""Activation checkpointing (recompute in backward, same gradients, same names) and offloading."""

import contextlib
import copy

import pytest
import torch
from torch import nn

from tune.training import (
    NoOpManager,
    OffloadActivations,
    activation_offloading_supported,
    apply_activation_checkpointing,
    apply_selective_activation_checkpointing,
    get_act_offloading_ctx_manager,
    set_activation_checkpointing,
)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        self.calls = 0

    def forward(self, x, *, scale=1.0):
        self.calls += 1
        return x + scale * self.inner(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.output = nn.Linear(8, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return self.output(x).sum()


def _grads(model):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    model(x).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("policy", [{Block}, lambda module: isinstance(module, Block)])
def test_checkpointing_recomputes_in_backward_with_identical_gradients_and_names(policy):
    torch.manual_seed(0)
    plain = Net()
    wrapped = copy.deepcopy(plain)
    assert apply_activation_checkpointing(wrapped, policy) == 3
    want = _grads(plain)
    got = _grads(wrapped)
    assert got.keys() == want.keys() and wrapped.state_dict().keys() == plain.state_dict().keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0)
    assert [layer.calls for layer in plain.layers] == [1, 1, 1]
    assert [layer.calls for layer in wrapped.layers] == [2, 2, 2]  # forward once, recomputed once in backward


def test_checkpointing_is_skipped_without_grad_and_survives_deepcopy():
    torch.manual_seed(0)
    model = Net()
    apply_activation_checkpointing(model, {Block})
    with torch.no_grad():
        model(torch.randn(2, 8))
    assert [layer.calls for layer in model.layers] == [1, 1, 1]
    clone = copy.deepcopy(model)
    _grads(clone)
    assert [layer.calls for layer in clone.layers] == [3, 3, 3]  # the copy recomputes its own layers
    assert [layer.calls for layer in model.layers] == [1, 1, 1]


def test_nested_matches_are_wrapped_once_and_no_match_is_an_error():
    model = Net()
    # Block and its inner Sequential both match; only the outer one is checkpointed
    assert apply_activation_checkpointing(model, {Block, nn.Sequential}) == 3
    with pytest.raises(ValueError, match="matched no module"):
        apply_activation_checkpointing(Net(), {nn.Conv2d})


def test_offloading_is_reported_unsupported_on_cpu_and_is_a_no_op_there():
    supported, reason = activation_offloading_supported("cpu")
    assert not supported and "no effect on CPU" in reason and "enable_activation_checkpointing" in reason
    assert activation_offloading_supported("cuda")[0]
    torch.manual_seed(0)
    model = Net()
    want = _grads(copy.deepcopy(model))
    offload = OffloadActivations(min_offload_size=0)
    with offload:
        got = _grads(model)
    assert offload.num_offloaded == 0  # everything already lives in host memory
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0)


def test_checkpointing_a_tune_decoder_by_layer_class():
    from tune.models.llama3 import llama3
    from tune.modules import TransformerSelfAttentionLayer

    torch.manual_seed(0)
    plain = llama3(
        vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=16, intermediate_dim=64
    )
    wrapped = copy.deepcopy(plain)
    assert apply_activation_checkpointing(wrapped, {TransformerSelfAttentionLayer}) == 2
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    plain(tokens).logsumexp(-1).sum().backward()
    wrapped(tokens).logsumexp(-1).sum().backward()
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_selective_checkpointing_wraps_every_nth_layer_and_keeps_gradients():
    torch.manual_seed(0)
    model = Net()
    want = _grads(copy.deepcopy(model))
    apply_selective_activation_checkpointing(model, "selective", 2)
    wrapped = [getattr(layer, "_forward_without_checkpoint", None) is not None for layer in model.layers]
    assert wrapped == [False, True, False]  # every 2nd layer, as torchtune counts them
    got = _grads(model)
    assert all(torch.equal(got[name], want[name]) for name in want)
    full = Net()
    apply_selective_activation_checkpointing(full, "full", None)
    assert all(getattr(layer, "_forward_without_checkpoint", None) is not None for layer in full.layers)
    with pytest.raises(ValueError, match="layer interval"):
        apply_selective_activation_checkpointing(Net(), "selective", "op")


def test_set_activation_checkpointing_takes_torchtunes_arguments():
    model = Net()
    set_activation_checkpointing(model, {Block})
    assert all(getattr(layer, "_forward_without_checkpoint", None) is not None for layer in model.layers)
    with pytest.raises(ValueError, match="checkpoint_wrapper_fn"):
        set_activation_checkpointing(Net(), {Block}, checkpoint_wrapper_fn=None)


def test_no_op_manager_overrides_an_enclosing_saved_tensors_hook():
    packed = []

    def pack(tensor):
        packed.append(tensor.shape)
        return tensor

    x = torch.randn(3, 3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        (x * x).sum().backward()
        num_outer = len(packed)
        with NoOpManager():
            (x * x).sum().backward()
    assert num_outer > 0 and len(packed) == num_outer  # inside NoOpManager the outer hook saw nothing


def test_act_offloading_ctx_manager_keeps_the_output_projection_on_device():
    model = Net()
    assert isinstance(get_act_offloading_ctx_manager(model, False), contextlib.nullcontext)
    ctx = get_act_offloading_ctx_manager(model, True)
    assert isinstance(ctx, OffloadActivations) and (ctx.min_offload_size, ctx.use_streams) == (1024, True)
    assert model.output._forward_pre_hooks and model.output._forward_hooks  # output runs under NoOpManager
    with ctx:
        model(torch.randn(2, 8)).backward()  # on CPU nothing moves; the hooks enter and leave cleanly
