"""Expert parallelism (tune.training.apply_expert_parallel) on CPU with gloo and 2 processes, against the same
training run in one process: a tiny Qwen3-MoE (4 experts, 2 per token), full and with LoRA on the experts."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests._helpers import free_port
from tune.models.qwen3_moe import lora_qwen3_moe, qwen3_moe
from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.modules.moe import SwiGLUExperts
from tune.training import (
    all_reduce_sum,
    apply_expert_parallel,
    clip_grad_norm,
    gather_cpu_state_dict,
    init_adapters,
    init_distributed,
    init_expert_parallel_mesh,
    load_from_full_model_state_dict,
    num_loss_tokens,
    shard_model,
    step_loss_scale,
)
from tune.training._expert_parallel import check_expert_parallel_dim

IGNORE = -100
WORLD, STEPS, LR, MAX_NORM = 2, 3, 1e-2, 0.5
DIMS = dict(
    vocab_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    embed_dim=16,
    max_seq_len=16,
    intermediate_dim=32,
    moe_intermediate_dim=8,
    num_experts=4,
    experts_per_token=2,
    head_dim=8,
)
LORA = dict(lora_attn_modules=["q_proj"], apply_lora_to_experts=True, lora_rank=2, lora_alpha=4.0)


def _build(lora: bool):
    return lora_qwen3_moe(**LORA, **DIMS) if lora else qwen3_moe(**DIMS)


def _data():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, DIMS["vocab_size"], (4, 12), generator=gen)
    labels = tokens.clone()
    for row, length in enumerate([12, 4, 9, 6]):  # rank 0 gets rows 0-1, rank 1 rows 2-3: unequal token counts
        labels[row, length:] = IGNORE
    return tokens, shift_labels(labels)


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _train(model, tokens, labels):
    """The loop both runs share: summed loss scaled by the step's global token count, clip, AdamW."""
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2, reduction="sum")
    loss_fn.set_model_output(model)
    optimizer = torch.optim.AdamW(_trainable(model), lr=LR, foreach=False)
    losses, norms = [], []
    for _ in range(STEPS):
        loss = loss_fn(model(tokens), labels) * step_loss_scale(num_loss_tokens(labels))
        loss.backward()
        norms.append(clip_grad_norm(_trainable(model), MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append((all_reduce_sum(loss.detach()) / torch.distributed.get_world_size()).item())
    return losses, norms


def _worker(rank, port, start_states, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    init_distributed("gloo")
    try:
        ep_mesh = init_expert_parallel_mesh(WORLD, 2)
        tokens, labels = (t[2 * rank : 2 * rank + 2] for t in _data())
        results = {}
        for lora, start in start_states.items():
            torch.manual_seed(0)
            with torch.device("meta"):
                model = _build(lora)
            if lora:  # adapters from the same seed on every rank, before their experts are split
                init_adapters(model, "cpu")
                for name, param in model.named_parameters():
                    param.requires_grad_("lora" in name)
            apply_expert_parallel(model, ep_mesh)
            experts = model.layers[0].mlp.experts
            local_shape = tuple(experts.gate_proj.to_local().shape)
            shard_model(model, dp_mesh=None, expert_mesh=ep_mesh)
            load_from_full_model_state_dict(model, start, "cpu", strict=True)
            losses, norms = _train(model, tokens, labels)
            final = gather_cpu_state_dict(model)
            results[lora] = {"losses": losses, "norms": norms, "final": final, "local_shape": local_shape}
        # without expert parallelism FSDP2 shards the stacked experts along dim 0 like any parameter: 3 experts
        # on 2 ranks are chunked as torch.chunk does, 2 + 1 (the last shard padded), and gather back whole
        torch.manual_seed(0)
        plain = SwiGLUExperts(dim=4, hidden_dim=8, num_experts=3)
        full = plain.gate_proj.detach().clone()
        shard_model(plain, shard_conditions=[])
        results["uneven"] = {
            "local_experts": plain.gate_proj.to_local().shape[0],
            "gathered_equal": torch.equal(gather_cpu_state_dict(plain, is_rank_zero=True)["gate_proj"], full),
        }
        all_results = [None] * WORLD
        torch.distributed.all_gather_object(all_results, results["uneven"])
        results["uneven"] = all_results
        with pytest.raises(ValueError, match="must divide the number of experts \\(3\\)"):
            apply_expert_parallel(qwen3_moe(**{**DIMS, "num_experts": 3}), ep_mesh)
        with pytest.raises(ValueError, match="expert_parallel_dim=3 does not divide the world size 2"):
            init_expert_parallel_mesh(WORLD, 3)
        if rank == 0:
            torch.save(results, result_path)
    finally:
        torch.distributed.destroy_process_group()


def _reference(lora: bool):
    torch.manual_seed(0)
    model = _build(lora)
    if lora:
        for name, param in model.named_parameters():
            param.requires_grad_("lora" in name)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    init_distributed("gloo")  # a one-process group: the same helpers as the ranks
    try:
        losses, norms = _train(model, *_data())
    finally:
        torch.distributed.destroy_process_group()
    return start, {"losses": losses, "norms": norms, "final": model.state_dict()}


def test_expert_parallel_two_ranks_match_one_process(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    starts, references = {}, {}
    for lora in (False, True):
        starts[lora], references[lora] = _reference(lora)
    result_path = tmp_path / "result.pt"
    mp.spawn(_worker, args=(free_port(), starts, str(result_path)), nprocs=WORLD)
    results = torch.load(result_path, weights_only=True)
    assert results["uneven"] == [
        {"local_experts": 2, "gathered_equal": True},
        {"local_experts": 1, "gathered_equal": True},
    ]
    for lora in (False, True):
        got, ref = results[lora], references[lora]
        assert got["local_shape"] == (2, DIMS["moe_intermediate_dim"], DIMS["embed_dim"])  # 2 whole experts
        loss_diff = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"], strict=True))
        weight_diff = max((got["final"][k] - v).abs().max().item() for k, v in ref["final"].items())
        print(f"lora={lora}: max |loss diff| {loss_diff:.2e}, max |weight diff| {weight_diff:.2e}")
        assert got["final"].keys() == ref["final"].keys()
        assert loss_diff < 1e-5
        assert got["norms"] == pytest.approx(ref["norms"], rel=1e-5)
        assert weight_diff < 1e-5
        # the experts trained (the comparison is not between two untouched copies of the start)
        key = "layers.0.mlp.experts.gate_proj_lora_b" if lora else "layers.0.mlp.experts.gate_proj"
        assert (ref["final"][key] - starts[lora][key]).abs().max() > 1e-4


def test_expert_parallel_dim_must_be_a_positive_integer():
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="expert_parallel_dim must be a positive integer"):
            check_expert_parallel_dim(bad)
    check_expert_parallel_dim(4)


def test_local_param_is_the_parameter_without_expert_parallelism():
    experts = SwiGLUExperts(dim=4, hidden_dim=8, num_experts=2)
    assert experts.local_param("gate_proj") is experts.gate_proj
