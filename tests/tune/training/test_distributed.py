"""FSDP2 helpers on CPU with gloo and 2 processes, against the same training run in one process."""

import os

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tests._helpers import free_port
from tune.models.llama3 import llama3
from tune.modules import RotaryPositionalEmbeddings, TransformerSelfAttentionLayer
from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.modules.peft import LoRALinear, dequantize
from tune.training import (
    all_reduce_sum,
    clip_grad_norm,
    gather_cpu_state_dict,
    get_distributed_backend,
    get_full_optimizer_state_dict,
    get_shard_conditions,
    init_distributed,
    is_distributed,
    load_from_full_model_state_dict,
    load_from_full_optimizer_state_dict,
    num_loss_tokens,
    shard_model,
    step_loss_scale,
    validate_no_params_on_meta_device,
)

IGNORE = -100
VOCAB, DIM, WORLD = 32, 8, 2
STEPS, LR, MAX_NORM = 3, 1e-2, 0.5


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        # RoPE's tables are non-persistent buffers: after meta init they must be recomputed, not loaded
        self.rope = RotaryPositionalEmbeddings(dim=DIM, max_seq_len=16)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.skip_output_layer = False

    def forward(self, tokens):
        h = self.rope(self.tok_embeddings(tokens).unsqueeze(2)).squeeze(2)  # [b, s, 1 head, DIM]
        for layer in self.layers:
            h = h + layer(h)
        h = self.norm(h)
        return h if self.skip_output_layer else self.output(h)


def _data():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (4, 10), generator=gen)
    labels = tokens.clone()
    for row, length in enumerate([10, 3, 8, 5]):  # ranks get 2 rows each: 13 and 13 tokens before the shift
        labels[row, length:] = IGNORE
    return tokens, shift_labels(labels)


def _train(model, tokens, labels):
    """The loop both runs share: summed loss scaled by the step's global token count, clip, AdamW."""
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2, reduction="sum")
    loss_fn.set_model_output(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for _ in range(STEPS):
        scale = step_loss_scale(num_loss_tokens(labels))
        loss = loss_fn(model(tokens), labels) * scale
        loss.backward()
        norms.append(clip_grad_norm(model, MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # each rank's loss is its share times world_size: the global mean is the sum over ranks / world size
        losses.append(
            (all_reduce_sum(loss.detach()) / torch.distributed.get_world_size()).item()
            if torch.distributed.is_initialized()
            else loss.item()
        )
    return losses, norms, optimizer


def _init_new_layer(layer):
    # same seed on every rank (and in the reference), so every rank holds the same full initial values
    torch.manual_seed(5)
    layer.reset_parameters()


def _worker(rank, port, full_state_dict, full_decoder_state_dict, result_path):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    init_distributed()  # gloo: no CUDA here
    with torch.device("meta"):
        model = TinyDecoder()
    _init_new_layer(model.layers[1][0].to_empty(device="cpu"))  # "adapter": not in the checkpoint
    shard_model(model)  # one unit per `layers.N`, then the root
    load_from_full_model_state_dict(model, full_state_dict, strict=False)
    local = model.norm.weight.to_local()  # loaded from the checkpoint (layers.1.0 was initialised instead)
    # a shard must not be a view that keeps the full tensor's storage alive
    local_rows = local.shape[0] if local.untyped_storage().nbytes() == local.numel() * local.element_size() else -1
    tokens, labels = _data()
    rows = slice(2 * rank, 2 * rank + 2)
    losses, norms, optimizer = _train(model, tokens[rows], labels[rows])
    state = gather_cpu_state_dict(model)
    # torchtune's optimizer-state helpers: gather the AdamW state, load it into a fresh optimizer, gather again
    optim_state = get_full_optimizer_state_dict(model, optimizer, is_rank_zero=rank == 0)
    fresh = torch.optim.AdamW(model.parameters(), lr=LR)
    load_from_full_optimizer_state_dict(model, fresh, optim_state, torch.device("cpu"))  # rank 0's is broadcast
    reloaded_optim_state = get_full_optimizer_state_dict(model, fresh, is_rank_zero=True)
    with torch.device("meta"):
        uninitialised = TinyDecoder()
    shard_model(uninitialised)
    # a model may load in parts (torchtune's recipes resume the adapter, then the base): what the checkpoint lacks
    # stays on meta, and the check of the finished model names it
    load_from_full_model_state_dict(uninitialised, full_state_dict, strict=False)
    try:
        validate_no_params_on_meta_device(uninitialised)
        raise AssertionError("a parameter left on meta must be refused")
    except RuntimeError as err:
        assert "layers.1.0.weight is still on the meta device" in str(err)
    qlora_output, qlora_state = _qlora_forward_sharded()
    decoder_loss = _decoder_loss_sharded(full_decoder_state_dict, rank)
    if rank == 0:
        torch.save(
            {
                "state": state,
                "optim_state": optim_state["state"],
                "reloaded_optim_state": reloaded_optim_state["state"],
                "losses": losses,
                "norms": norms,
                "local_rows": local_rows,
                "qlora_output": qlora_output,
                "qlora_state": qlora_state,
                "decoder_loss": decoder_loss,
            },
            result_path,
        )
    else:
        assert state == {} and optim_state == {}
    torch.distributed.destroy_process_group()


QLORA_DIM = 256  # 1024 NF4 blocks -> 4 scale blocks: whole blocks on each of 2 ranks


def _qlora_model(meta: bool):
    with torch.device("meta" if meta else "cpu"):
        model = nn.Module()
        model.layers = nn.ModuleList([LoRALinear(QLORA_DIM, QLORA_DIM, rank=4, alpha=8.0, quantize_base=True)])
    layer = model.layers[0]
    if meta:
        layer.lora_a.to_empty(device="cpu")
        layer.lora_b.to_empty(device="cpu")
    torch.manual_seed(7)  # same adapters on every rank and in the reference
    nn.init.normal_(layer.lora_a.weight, std=0.1)
    nn.init.normal_(layer.lora_b.weight, std=0.1)
    return model


def _qlora_inputs():
    gen = torch.Generator().manual_seed(11)
    return {"layers.0.weight": torch.randn(QLORA_DIM, QLORA_DIM, generator=gen) * 0.05}, torch.randn(
        3, QLORA_DIM, generator=gen
    )


def _qlora_forward_sharded():
    base, x = _qlora_inputs()
    model = _qlora_model(meta=True)
    shard_model(model)
    load_from_full_model_state_dict(model, base, strict=False)
    output = model.layers[0](x).detach()
    return output, gather_cpu_state_dict(model)


def _decoder():
    torch.manual_seed(0)
    return llama3(
        vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=16, max_seq_len=32, intermediate_dim=32
    )


def _decoder_loss(model, tokens, labels):
    """Mean token loss over the global batch (each rank's scaled share, summed over ranks / world size)."""
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2, reduction="sum")
    loss_fn.set_model_output(model)
    loss = loss_fn(model(tokens), labels) * step_loss_scale(num_loss_tokens(labels))
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return (all_reduce_sum(loss.detach()) / world_size).item()


def _decoder_loss_sharded(full_state_dict, rank):
    # a real tune decoder: built on meta, sharded per TransformerSelfAttentionLayer, RoPE tables recomputed
    with torch.device("meta"):
        model = _decoder()
    shard_model(model, [TransformerSelfAttentionLayer])
    load_from_full_model_state_dict(model, full_state_dict, strict=True)
    tokens, labels = _data()
    rows = slice(2 * rank, 2 * rank + 2)
    return _decoder_loss(model, tokens[rows], labels[rows])


def test_fsdp2_two_ranks_match_one_process(tmp_path):
    """One 2-rank run checks: loss/grad-norm/weights vs one process, meta init, partial load, QLoRA NF4 shards."""
    torch.manual_seed(0)
    reference = TinyDecoder()
    _init_new_layer(reference.layers[1][0])
    # the checkpoint lacks layers.1.0 (like LoRA adapters at the start of training)
    full_state_dict = {k: v.clone() for k, v in reference.state_dict().items() if not k.startswith("layers.1.0.")}
    tokens, labels = _data()
    want_losses, want_norms, reference_optimizer = _train(reference, tokens, labels)

    result_path = tmp_path / "rank0.pt"
    decoder = _decoder()
    decoder_state_dict = {k: v.clone() for k, v in decoder.state_dict().items()}
    want_decoder_loss = _decoder_loss(decoder, *_data())
    mp.spawn(_worker, args=(free_port(), full_state_dict, decoder_state_dict, str(result_path)), nprocs=WORLD)
    got = torch.load(result_path, weights_only=True)

    weight_error = max((got["state"][k] - v).abs().max().item() for k, v in reference.state_dict().items())
    loss_error = max(abs(a - b) for a, b in zip(got["losses"], want_losses))
    print(f"2 ranks vs 1 process over {STEPS} AdamW steps: loss {loss_error:.1e}, weights {weight_error:.1e}")
    assert got["local_rows"] == DIM // WORLD  # each rank kept only its half of the weight, in its own storage
    assert got["losses"] == pytest.approx(want_losses, abs=1e-5)
    assert got["norms"] == pytest.approx(want_norms, abs=1e-5)
    assert want_norms[0] > MAX_NORM  # clipping was active, so sharded clipping is tested too
    assert got["state"].keys() == reference.state_dict().keys()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(got["state"][key], value, atol=1e-5, rtol=0, msg=key)

    assert got["decoder_loss"] == pytest.approx(want_decoder_loss, abs=1e-5)
    # QLoRA: NF4 base weights quantised from the full weight, split over the ranks, gathered dequantised
    base, x = _qlora_inputs()
    qlora = _qlora_model(meta=False)
    qlora.load_state_dict(base, strict=False)
    torch.testing.assert_close(got["qlora_output"], qlora.layers[0](x).detach(), atol=1e-5, rtol=0)
    gathered = got["qlora_state"]["layers.0.weight"]
    torch.testing.assert_close(gathered, dequantize(qlora.layers[0].weight), atol=0, rtol=0)

    # optimizer state gathered by parameter name equals the one-process AdamW state, and survives a reload
    names = [name for name, _ in reference.named_parameters()]
    for index, state in reference_optimizer.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["optim_state"][names[index]][key], state[key], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(
                got["reloaded_optim_state"][names[index]][key], got["optim_state"][names[index]][key]
            )


def test_init_distributed_refuses_nccl_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so NCCL is a valid request")
    with pytest.raises(ValueError, match="needs CUDA.*backend='gloo'"):
        init_distributed(backend="nccl")


def test_shard_model_needs_a_process_group():
    with pytest.raises(ValueError, match="init_distributed"):
        shard_model(TinyDecoder())


def test_init_distributed_outside_torchrun_starts_a_one_process_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not is_distributed()  # not launched by torchrun
    try:
        assert init_distributed(backend="gloo") is True
        assert torch.distributed.get_world_size() == 1 and torch.distributed.is_initialized()
        assert init_distributed() is False  # already initialised: left alone
        assert step_loss_scale(torch.tensor(4)).item() == 0.25
    finally:
        torch.distributed.destroy_process_group()


def test_all_reduce_sum_is_identity_without_a_process_group():
    value = torch.tensor(7)
    assert all_reduce_sum(value) is value


def test_torchtunes_shard_rule_backend_and_meta_check():
    assert get_shard_conditions("decoder.layers.3", nn.Linear(1, 1))
    assert not get_shard_conditions("layers.3.attn", nn.Linear(1, 1))
    assert get_shard_conditions("tok_embeddings", nn.Embedding(2, 2), names_to_match=["tok_embeddings"])
    assert get_distributed_backend("cpu") == "gloo" and get_distributed_backend("cuda") == "nccl"
    assert get_distributed_backend("cuda", offload_ops_to_cpu=True) == "cuda:nccl,cpu:gloo"
    # gloo already serves CPU tensors: torchtune's "cpu:gloo,cpu:gloo" is refused by init_process_group
    assert get_distributed_backend("cpu", offload_ops_to_cpu=True) == "gloo"
    with torch.device("meta"):
        model = TinyDecoder()
    with pytest.raises(RuntimeError, match="tok_embeddings.weight is still on the meta device"):
        validate_no_params_on_meta_device(model)
    validate_no_params_on_meta_device(TinyDecoder())


def test_gather_cpu_state_dict_takes_torchtunes_rank_and_adapter_arguments(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    model = nn.Sequential(LoRALinear(4, 4, rank=2, alpha=4.0))  # unsharded: copied as it is, no collective
    assert gather_cpu_state_dict(model, is_rank_zero=False) == {}
    adapter = gather_cpu_state_dict(model, True, None, adapter_weights_only=True)
    assert sorted(adapter) == ["0.lora_a.weight", "0.lora_b.weight"]
    assert set(gather_cpu_state_dict(model)) == set(model.state_dict())  # default: rank 0 keeps everything


def test_is_distributed_means_launched_by_torchrun(monkeypatch):
    # torchtune's meaning: the env:// rendezvous variables are set, whether or not a group is initialised yet
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "1")
    assert is_distributed() and not torch.distributed.is_initialized()
    monkeypatch.delenv("MASTER_PORT")
    assert not is_distributed()
