"""Context parallelism on CPU with gloo, against one process.

Each model trains 2 SGD steps with clipping, the way the distributed recipes do it: every rank of a ``cp`` group
reads the same batch, counts its loss tokens (``step_loss_scale``), keeps its chunks (``ContextParallel.shard``),
sums its chunks' token losses over the group (``ContextParallel.sum``) and FSDP2 shards the weights over
``dp_shard x cp`` (``fsdp_mesh``). Losses, gradient norms and the gathered weights must equal the same steps of the
whole batch in one process. Families: Llama 3 (grouped-query heads), Qwen2 (q/k/v biases, tied embeddings), Qwen3
(per-head q/k norms) and a LoRA Llama; batches: unpadded rows whose length is not a multiple of ``2 x cp`` (padded
by ``shard``), and packed rows with documents crossing the ranks' chunks (block-causal mask, per-document positions).
Layouts: 2 ranks (cp 2), 4 ranks (cp 4; 2 data-parallel x 2 context-parallel; 2 context-parallel x 2
tensor-parallel, for the families with a tensor-parallel plan).
"""

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tune.config import ConfigError, apply_defaults, check_training_config
from tune.models.gemma2 import gemma2
from tune.models.llama3 import base_llama_tp_plan, llama3, lora_llama3
from tune.models.qwen2_5 import base_qwen_tp_plan, qwen2
from tune.models.qwen3 import qwen3
from tune.models.qwen3_moe import qwen3_moe
from tune.modules import TransformerSelfAttentionLayer, get_block_causal_mask_from_document_ids
from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.training import (
    ContextParallel,
    all_reduce_sum,
    apply_tensor_parallel,
    check_context_parallel,
    clip_grad_norm,
    data_parallel_rank_and_size,
    fsdp_mesh,
    gather_cpu_state_dict,
    init_device_mesh,
    load_from_full_model_state_dict,
    num_loss_tokens,
    shard_model,
    step_loss_scale,
)

VOCAB, STEPS, LR, MAX_NORM = 64, 2, 0.5, 0.5
SIZES = dict(
    vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64, intermediate_dim=48
)
KINDS = ("llama", "qwen2", "qwen3", "lora")
TP_PLANS = {"llama": base_llama_tp_plan, "qwen2": base_qwen_tp_plan}
ROWS, SEQ_LEN = 4, 30  # 30 is not a multiple of 4 or 8: the last chunk is padded


def _build(kind: str) -> nn.Module:
    if kind == "llama":
        return llama3(**SIZES)
    if kind == "qwen2":
        return qwen2(**SIZES, tie_word_embeddings=True)
    if kind == "qwen3":
        return qwen3(**SIZES, head_dim=8, tie_word_embeddings=True)
    return lora_llama3(["q_proj", "v_proj", "output_proj"], **SIZES, lora_rank=4, lora_alpha=8)


def _batch(packed: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ_LEN), generator=gen)
    labels = tokens.clone()
    labels[1, SEQ_LEN - 6 :] = -100
    labels[2, :9] = -100
    inputs = {}
    if packed:  # three documents of 7, 18 and 5 tokens in every row
        lengths = torch.tensor([7, 18, 5])
        document_ids = torch.repeat_interleave(torch.arange(3), lengths)[None].expand(ROWS, SEQ_LEN)
        inputs["mask"] = get_block_causal_mask_from_document_ids(document_ids)
        starts = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
        inputs["input_pos"] = (torch.arange(SEQ_LEN) - starts)[None].expand(ROWS, SEQ_LEN).contiguous()
    return tokens, shift_labels(labels), inputs


def _train(model: nn.Module, packed: bool, context_parallel: ContextParallel, rows: slice) -> list[tuple[float, float]]:
    tokens, labels, inputs = _batch(packed)
    tokens, labels = tokens[rows], labels[rows]
    inputs = {key: value[rows] for key, value in inputs.items()}
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2, reduction="sum")
    loss_fn.set_model_output(model)
    # SGD: the weights' difference is the gradients' (AdamW would blow up the rounding of near-zero gradients)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    results = []
    for _ in range(STEPS):
        scale = step_loss_scale(num_loss_tokens(labels))  # the whole rows' tokens, counted on every rank
        local_tokens, local_labels, local_inputs = context_parallel.shard(tokens, labels, inputs)
        loss = context_parallel.sum(loss_fn(model(local_tokens, **local_inputs), local_labels)) * scale
        loss.backward()
        norm = clip_grad_norm(model, MAX_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        results.append(((all_reduce_sum(loss.detach()) / world).item(), norm.item()))  # as the recipes log it
    return results


def _worker(rank: int, world: int, layouts: list, store: str, states: dict, result_path: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = {}
    for cp, tp in layouts:
        mesh = init_device_mesh(world, tp, "cpu", context_parallel_dim=cp)
        dp_rank, dp_size = data_parallel_rank_and_size(mesh)
        rows = slice(dp_rank * ROWS // dp_size, (dp_rank + 1) * ROWS // dp_size)  # this shard's rows of the batch
        for kind, state in states.items():
            if tp > 1 and kind not in TP_PLANS:
                continue
            for packed in (False, True):
                with torch.device("meta"):
                    model = _build(kind)
                check_context_parallel(model, cp)
                if kind == "lora":
                    for name, param in model.named_parameters():
                        param.requires_grad_("lora_" in name)
                if tp > 1:  # the heads and MLP columns split over the tp ranks, each attending its heads' keys
                    apply_tensor_parallel(model, TP_PLANS[kind](model), mesh["tp"])
                shard_model(model, [TransformerSelfAttentionLayer], dp_mesh=fsdp_mesh(mesh))
                load_from_full_model_state_dict(model, state, strict=True)
                steps = _train(model, packed, ContextParallel(mesh["cp"]), rows)
                results[(cp, tp, kind, packed)] = {"steps": steps, "state": gather_cpu_state_dict(model)}
    if rank == 0:
        torch.save(results, result_path)
    torch.distributed.destroy_process_group()


def _expected() -> tuple[dict, dict]:
    states, expected = {}, {}
    for kind in KINDS:
        torch.manual_seed(0)
        model = _build(kind)
        for module in model.modules():  # LoRA B starts at 0: give the adapters weights that move the outputs
            if hasattr(module, "lora_b"):
                nn.init.normal_(module.lora_b.weight, std=0.1)
        states[kind] = {k: v.clone() for k, v in model.state_dict().items()}
        for packed in (False, True):
            model.load_state_dict(states[kind])
            if kind == "lora":
                for name, param in model.named_parameters():
                    param.requires_grad_("lora_" in name)
            expected[(kind, packed)] = {"steps": _train(model, packed, ContextParallel(), slice(None))}
            expected[(kind, packed)]["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return states, expected


def _compare(results: dict, expected: dict, label: str) -> None:
    worst_loss = worst_weight = 0.0
    for (cp, tp, kind, packed), got in results.items():
        want = expected[(kind, packed)]
        losses, norms = zip(*got["steps"])
        ref_losses, ref_norms = zip(*want["steps"])
        assert list(losses) == pytest.approx(ref_losses, abs=1e-5, rel=0), (label, cp, tp, kind, packed)
        assert list(norms) == pytest.approx(ref_norms, rel=1e-5), (label, cp, tp, kind, packed)
        worst_loss = max(worst_loss, max(abs(a - b) for a, b in zip(losses, ref_losses)))
        for key, value in want["state"].items():
            difference = (got["state"][key] - value).abs().max().item()
            worst_weight = max(worst_weight, difference)
            assert difference < 2e-5, (label, cp, tp, kind, packed, key, difference)
    print(f"{label}: max |loss - one process| {worst_loss:.1e}, max |weights - one process| {worst_weight:.1e}")


@pytest.mark.parametrize(
    "world,layouts",
    [
        (2, [(2, 1)]),  # one data-parallel shard of 2 context-parallel ranks
        # cp 4; 2 data-parallel x 2 context-parallel ranks; 2 context-parallel x 2 tensor-parallel ranks
        (4, [(4, 1), (2, 1), (2, 2)]),
    ],
)
def test_context_parallel_training_equals_one_process(tmp_path, world, layouts):
    states, expected = _expected()
    result_path = str(tmp_path / "result.pt")
    args = (world, layouts, str(tmp_path / "store"), states, result_path)
    mp.start_processes(_worker, args=args, nprocs=world, start_method="spawn")
    results = torch.load(result_path, weights_only=False)
    kinds = {(cp, tp): len(KINDS) if tp == 1 else len(TP_PLANS) for cp, tp in layouts}
    assert len(results) == 2 * sum(kinds.values())
    _compare(results, expected, f"{world} ranks, (cp, tp) in {layouts}")


def test_models_context_parallelism_cannot_slice_are_refused():
    with torch.device("meta"):
        windowed = gemma2(**SIZES, head_dim=8, sliding_window_size=16)
        experts = qwen3_moe(**SIZES, head_dim=8, num_experts=4, experts_per_token=2, moe_intermediate_dim=16)
    with pytest.raises(ValueError, match="sliding_window"):
        check_context_parallel(windowed, 2)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        check_context_parallel(experts, 2)
    with pytest.raises(ValueError, match="text decoders"):
        check_context_parallel(nn.Linear(2, 2), 2)
    check_context_parallel(windowed, 1)  # nothing to check without context parallelism


def test_init_device_mesh_refuses_a_cp_size_that_does_not_divide_the_world():
    with pytest.raises(ValueError, match=r"context_parallel_dim=3 does not divide the 4 groups.*\[1, 2, 4\]"):
        init_device_mesh(8, tensor_parallel_dim=2, context_parallel_dim=3)
    with pytest.raises(ValueError, match="context_parallel_dim must be a positive integer"):
        init_device_mesh(8, context_parallel_dim=0)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({"context_parallel_dim": 0}, "must be a positive integer"),
        ({"context_parallel_dim": 2, "compile": True}, "compile: true"),
        ({"context_parallel_dim": 2, "expert_parallel_dim": 2}, "expert parallelism"),
    ],
)
def test_config_checks_report_context_parallel_settings(overrides, expected):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"epochs": 1, "gradient_accumulation_steps": 1, "max_steps_per_epoch": None, **overrides})
    apply_defaults(cfg, ("finetune", "distributed", "moe"))
    with pytest.raises(ConfigError, match=f"context_parallel_dim.*{expected}"):
        check_training_config(cfg, distributed=True)


def test_without_context_parallelism_shard_and_sum_change_nothing():
    tokens, labels, inputs = _batch(packed=False)
    same = ContextParallel().shard(tokens, labels, inputs)
    assert same[0] is tokens and same[1] is labels and same[2] is inputs
    loss = torch.tensor(2.5)
    assert ContextParallel().sum(loss) is loss
