"""Tensor parallelism (+ FSDP2 on the 2-D mesh) on CPU with gloo and 2 processes, against one process.

Each family's plan (Llama with an untied output, Qwen2.5 with q/k/v biases and a tied output, Qwen3 with the
per-head q_norm/k_norm) trains 3 AdamW steps with gradient clipping on a tiny model split over 2 tensor-parallel
ranks; losses, gradient norms and the gathered weights must equal the same steps of the unsplit model in one
process. The errors of a wrong plan or size are checked in the same workers.
"""

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tune.models.llama3 import base_llama_tp_plan, llama3, lora_llama3
from tune.models.qwen2_5 import base_qwen_tp_plan, qwen2
from tune.models.qwen3 import qwen3
from tune.modules import TransformerSelfAttentionLayer
from tune.modules.loss import LinearCrossEntropyLoss, shift_labels
from tune.training import (
    all_reduce_sum,
    apply_tensor_parallel,
    clip_grad_norm,
    data_parallel_rank_and_size,
    gather_cpu_state_dict,
    init_device_mesh,
    init_distributed,
    load_from_full_model_state_dict,
    num_loss_tokens,
    prepare_mha_for_tp,
    shard_model,
    step_loss_scale,
    tensor_parallel_size,
)

VOCAB, WORLD, STEPS, LR = 64, 2, 3, 1e-2
MAX_NORM = 0.5  # below every step's gradient norm (about 1 to 12): clipping is active in all runs
SIZES = dict(
    vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32, intermediate_dim=48
)


def _build(kind: str) -> nn.Module:
    if kind == "llama":  # untied output: embedding and output are split by vocabulary too
        return llama3(**SIZES)
    if kind == "qwen2_5":  # q/k/v biases split with their projections; tied output stays whole
        return qwen2(**SIZES, tie_word_embeddings=True)
    return qwen3(**SIZES, head_dim=8, tie_word_embeddings=True)  # per-head q_norm/k_norm


def _plan(kind: str, model: nn.Module) -> dict:
    return base_llama_tp_plan(model) if kind == "llama" else base_qwen_tp_plan(model)


def _train(model: nn.Module) -> list[tuple[float, float]]:
    """3 steps on a fixed batch: summed loss scaled by the global token count, clipping, AdamW."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=gen)
    labels = shift_labels(tokens.clone())
    labels[1, 7:] = -100
    loss_fn = LinearCrossEntropyLoss(num_output_chunks=2, reduction="sum")  # calls model.output itself, chunk by chunk
    loss_fn.set_model_output(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    results = []
    for _ in range(STEPS):
        loss = loss_fn(model(tokens), labels) * step_loss_scale(num_loss_tokens(labels))
        loss.backward()
        norm = clip_grad_norm(model, MAX_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # both tp ranks hold the whole loss (the batch is shared): the mean over ranks is the loss
        results.append(((all_reduce_sum(loss.detach()) / world).item(), norm.item()))
    return results


def _expect_error(fn, *fragments: str) -> None:
    try:
        fn()
    except ValueError as err:
        assert all(f in str(err) for f in fragments), str(err)
    else:
        raise AssertionError(f"expected a ValueError mentioning {fragments}")


def _check_errors(mesh) -> None:
    tp_mesh = mesh["tp"]
    with torch.device("meta"):
        qwen = _build("qwen3")
    # a plan that splits heads but leaves the shared per-head norm weight alone would sum half its gradient
    plan = {k: v for k, v in _plan("qwen3", qwen).items() if "norm" not in k}
    _expect_error(lambda: apply_tensor_parallel(qwen, plan, tp_mesh), "q_norm", "SequenceParallel")
    with torch.device("meta"):
        one_kv_head = llama3(**{**SIZES, "num_kv_heads": 1})
    _expect_error(
        lambda: apply_tensor_parallel(one_kv_head, _plan("llama", one_kv_head), tp_mesh), "num_kv_heads=1", "[1]"
    )
    with torch.device("meta"):
        lora = lora_llama3(["q_proj"], **SIZES)
    _expect_error(lambda: apply_tensor_parallel(lora, _plan("llama", lora), tp_mesh), "LoRA", "layers.0.attn.q_proj")
    with torch.device("meta"):
        llama = _build("llama")
    _expect_error(lambda: apply_tensor_parallel(llama, {"layers.*.attn.qkv": None}, tp_mesh), "'layers.*.attn.qkv'")


def _worker(rank: int, store: str, states: dict, result_path: str) -> None:
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for with tests running side by side
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    assert init_distributed() is False  # the recipes' call finds the group already initialised
    mesh = init_device_mesh(WORLD, tensor_parallel_dim=2, device_type="cpu")  # (dp_shard=1, tp=2)
    assert data_parallel_rank_and_size(mesh) == (0, 1) and tensor_parallel_size(mesh) == 2
    results = {}
    for kind, state in states.items():
        with torch.device("meta"):
            model = _build(kind)
        apply_tensor_parallel(model, _plan(kind, model), mesh["tp"])
        attn = model.layers[0].attn
        heads = (attn.num_heads, attn.num_kv_heads)  # per rank
        shard_model(model, [TransformerSelfAttentionLayer], dp_mesh=mesh["dp_shard"])
        load_from_full_model_state_dict(model, state, strict=True)
        results[kind] = {"steps": _train(model), "state": gather_cpu_state_dict(model), "heads": heads}
    _check_errors(mesh)
    if rank == 0:
        torch.save(results, result_path)
    torch.distributed.destroy_process_group()


def test_tensor_parallel_plans_train_like_one_process(tmp_path):
    states, expected = {}, {}
    for kind in ("llama", "qwen2_5", "qwen3"):
        torch.manual_seed(0)
        model = _build(kind)
        states[kind] = {k: v.clone() for k, v in model.state_dict().items()}
        expected[kind] = {"steps": _train(model), "state": model.state_dict()}
    result_path = str(tmp_path / "result.pt")
    mp.start_processes(_worker, args=(str(tmp_path / "store"), states, result_path), nprocs=WORLD, start_method="spawn")
    results = torch.load(result_path, weights_only=True)
    for kind in states:
        got, want = results[kind], expected[kind]
        print(kind, "tp=2", got["steps"], "\n", kind, "tp=1", want["steps"])
        assert got["heads"] == (2, 1)  # 4 query / 2 key-value heads split over 2 ranks
        losses, norms = zip(*got["steps"])
        ref_losses, ref_norms = zip(*want["steps"])
        assert list(losses) == pytest.approx(ref_losses, abs=1e-5, rel=0), kind
        assert list(norms) == pytest.approx(ref_norms, rel=1e-5), kind
        assert set(got["state"]) == set(want["state"])
        for key, value in want["state"].items():
            if key.endswith("k_proj.bias"):
                # its exact gradient is 0 (a key bias adds q.b to every score of a query, which softmax ignores):
                # AdamW turns the rounding noise into +-lr steps that differ between any two summation orders
                continue
            torch.testing.assert_close(got["state"][key], value, atol=2e-5, rtol=0, msg=f"{kind} {key}")


def test_init_device_mesh_refuses_a_tp_size_that_does_not_divide_the_world():
    # checked before any process group is touched
    with pytest.raises(ValueError, match=r"tensor_parallel_dim=3 does not divide the world size 8.*\[1, 2, 4, 8\]"):
        init_device_mesh(8, tensor_parallel_dim=3)
    with pytest.raises(ValueError, match="positive integer"):
        init_device_mesh(8, tensor_parallel_dim=0)


def test_data_parallel_rank_and_size_without_a_mesh():
    assert data_parallel_rank_and_size(None) == (0, 1) and tensor_parallel_size(None) == 1


class _StandInMesh:
    """A tensor-parallel mesh as prepare_mha_for_tp sees it: only its size."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def test_prepare_mha_for_tp_gives_each_attention_its_per_rank_sizes():
    model = llama3(**SIZES)  # 4 query heads, 2 kv heads, embed_dim 32
    prepare_mha_for_tp(model, _StandInMesh(2))
    sizes = {(m.num_heads, m.num_kv_heads, m.embed_dim) for m in model.modules() if hasattr(m, "num_kv_heads")}
    assert sizes == {(2, 1, 16)}
    with pytest.raises(ValueError, match="must divide"):
        prepare_mha_for_tp(llama3(**SIZES), _StandInMesh(4))  # 2 kv heads over 4 ranks
