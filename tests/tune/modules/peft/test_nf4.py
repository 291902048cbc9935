"""NF4 block sizes (tune/modules/peft/_nf4.py): torchao's 64 / 256 for real-size weights, scale groups that FSDP
can split for small ones, the QLoRA merge over them, and sharding on 2 gloo ranks against one process.

The expected quantisations are torchao's ``to_nf4`` called directly with the block sizes written in each test.
"""

import math
import os

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tests._helpers import free_port
from tune.modules.peft import (
    LoRALinear,
    NF4ShardingError,
    check_nf4_shardable,
    dequantize,
    get_adapter_params,
    get_merged_lora_ckpt,
    nf4_block_sizes,
    set_trainable_params,
    to_nf4,
)
from tune.utils import TuneError

torchao_quantization = pytest.importorskip("torchao.quantization")

# the inner tensors and sizes that make up an NF4Tensor (torchao 0.18)
_NF4_PARTS = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4")


def _assert_same_nf4(got: torch.Tensor, want: torch.Tensor) -> None:
    for size in ("block_size", "scaler_block_size", "n_blocks"):
        assert getattr(got, size) == getattr(want, size), size
    for part in _NF4_PARTS:
        assert torch.equal(getattr(got, part), getattr(want, part)), part


# ------------------------------------------------------------------------------------ block sizes, one process


# Quantised layers of shipped QLoRA configs. All of them keep 64 / 256 except Qwen2.5 0.5B (896 = 7 x 128 wide),
# whose 49 (q_proj) or 7 (k_proj) groups of 256 split over no even number of ranks: see SMALL below.
@pytest.mark.parametrize(
    "shape",
    [
        (2048, 2048),  # Llama 3.2 1B q_proj / output_proj: 256 groups of 256 scales
        (512, 2048),  # Llama 3.2 1B k_proj / v_proj: 64 groups
        (8192, 2048),  # Llama 3.2 1B gate_proj / up_proj
        (1024, 2304),  # Gemma 2 2B k_proj / v_proj (4 KV heads of 256): 144 groups
        (128256, 4096),  # Llama 3 8B output (QLoRA on the output layer)
        (4096, 14336),  # Llama 3 8B down_proj
    ],
)
def test_real_size_weights_keep_torchaos_default_block_sizes(shape):
    assert nf4_block_sizes(shape) == (64, 256)  # QLoRA's sizes, torchao's (and bitsandbytes') defaults


def test_real_size_weight_quantises_exactly_as_torchaos_default():
    weight = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(0)) * 0.02
    _assert_same_nf4(to_nf4(weight), torchao_quantization.to_nf4(weight))  # to_nf4(w) = to_nf4(w, 64, 256)


# shape -> (scales per group, number of groups). Rows and blocks bound the rank counts that can ever split a weight:
# N ranks need N | rows (FSDP's row shards) and N | groups (torchao's split), so groups are made a multiple of the
# largest power of two up to 8 dividing both rows and blocks, as large as possible up to 256.
SMALL = {
    (64, 64): (8, 8),  # the tiny q_proj of tests/recipes/_family_assets.py: was 1 group of 64
    (32, 64): (4, 8),  # its k_proj / v_proj (2 KV heads of 16)
    (128, 64): (16, 8),  # its gate_proj / up_proj
    (64, 128): (16, 8),  # its down_proj
    (128, 128): (32, 8),  # 16384 values: torchao's default would be 1 group of 256
    (896, 896): (224, 56),  # Qwen2.5 0.5B q_proj (7 x 128 wide): 49 groups of 256 would split over no even count
    (128, 896): (224, 8),  # Qwen2.5 0.5B k_proj: 7 groups of 256
    (257, 64): (1, 257),  # 257 rows split over no rank count; 257 blocks (a prime > 256) in groups of one
    (3, 64): (3, 1),  # 3 rows: no even split, so the groups stay as large as possible
}


@pytest.mark.parametrize("shape", list(SMALL), ids=[f"{r}x{c}" for r, c in SMALL])
def test_small_weights_get_scale_groups_that_split_over_up_to_8_ranks(shape):
    scaler_block_size, num_groups = SMALL[shape]
    assert nf4_block_sizes(shape) == (64, scaler_block_size)
    num_blocks = math.prod(shape) // 64
    assert num_blocks // scaler_block_size == num_groups
    assert num_groups % math.gcd(shape[0], num_blocks, 8) == 0
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    quantized = to_nf4(weight)
    assert quantized.quantization_factor.numel() == num_groups
    _assert_same_nf4(quantized, torchao_quantization.to_nf4(weight, 64, scaler_block_size))
    assert torch.equal(
        dequantize(quantized), torchao_quantization.to_nf4(weight, 64, scaler_block_size).get_original_weight()
    )


def test_block_sizes_refuse_weights_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 64"):
        nf4_block_sizes((3, 5))


# 96 x 128 has 96 rows and 192 blocks: 8 groups of 24 scales
@pytest.mark.parametrize("shape, scaler_block_size", [((64, 64), 8), ((32, 64), 4), ((96, 128), 24)])
def test_qlora_merge_is_dequantised_nf4_plus_scaled_update(shape, scaler_block_size):
    """get_merged_lora_ckpt over the small-weight block sizes: W' = deq(nf4(W)) + (alpha / r) B A."""
    out_dim, in_dim = shape
    rank, alpha = 4, 8.0
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(shape, generator=generator) * 0.05
    layer = LoRALinear(in_dim, out_dim, rank=rank, alpha=alpha, quantize_base=True)
    layer.load_state_dict({"weight": weight}, strict=False)
    with torch.no_grad():
        layer.lora_a.weight.copy_(torch.randn(rank, in_dim, generator=generator))
        layer.lora_b.weight.copy_(torch.randn(out_dim, rank, generator=generator))
    merged = get_merged_lora_ckpt(layer.state_dict(), rank=rank, alpha=alpha)["weight"]
    base = torchao_quantization.to_nf4(weight, 64, scaler_block_size)
    expected = base.get_original_weight() + (alpha / rank) * layer.lora_b.weight @ layer.lora_a.weight
    torch.testing.assert_close(merged, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(merged, weight + (alpha / rank) * layer.lora_b.weight @ layer.lora_a.weight, atol=1e-4)


@pytest.mark.parametrize(
    "shape, num_shards, hint",
    [
        ((2, 96), 2, "single device"),  # 3 blocks: 1 group, which no 2 ranks can share
        ((3, 64), 2, "single device"),  # 3 rows
        ((32, 64), 16, "divides 8"),  # 8 groups
    ],
)
def test_unshardable_nf4_weight_is_one_actionable_error(shape, num_shards, hint):
    weight = to_nf4(torch.randn(shape))
    with pytest.raises(NF4ShardingError) as caught:
        check_nf4_shardable("layers.0.attn.q_proj.weight", weight, num_shards)
    message = str(caught.value)
    assert isinstance(caught.value, TuneError) and isinstance(caught.value, ValueError)
    assert "\n" not in message
    for part in ("'layers.0.attn.q_proj.weight'", f"shape {shape}", f"over {num_shards} ranks", hint, "quantize_base"):
        assert part in message, (part, message)


def test_shardable_nf4_weights_pass_the_check():
    for shape, num_shards in [((64, 64), 2), ((64, 64), 8), ((32, 64), 4), ((2048, 2048), 8)]:
        check_nf4_shardable("w", to_nf4(torch.zeros(shape, device="meta")), num_shards)


# --------------------------------------------------------------------------------------------- 2 gloo ranks

WORLD = 2
# the tiny dimensions of tests/recipes/_family_assets.py (head_dim 16, 4 query and 2 KV heads)
EMBED_DIM, NUM_HEADS, NUM_KV_HEADS, INTERMEDIATE_DIM, VOCAB = 64, 4, 2, 128, 128
LORA_RANK, LORA_ALPHA = 8, 16.0


def _tiny_qlora(device: str):
    from tune.models.llama3 import lora_llama3

    with torch.device(device):
        model = lora_llama3(
            ["q_proj", "k_proj", "v_proj", "output_proj"],
            apply_lora_to_mlp=True,
            apply_lora_to_output=True,
            vocab_size=VOCAB,
            num_layers=2,
            num_heads=NUM_HEADS,
            num_kv_heads=NUM_KV_HEADS,
            embed_dim=EMBED_DIM,
            max_seq_len=32,
            intermediate_dim=INTERMEDIATE_DIM,
            lora_rank=LORA_RANK,
            lora_alpha=LORA_ALPHA,
            quantize_base=True,
        )
    set_trainable_params(model, get_adapter_params(model))  # as the LoRA recipes do: only adapters train
    return model


def _tiny_checkpoint() -> dict[str, torch.Tensor]:
    """Random full weights for every key of the tiny QLoRA model: base (dense) and adapters (B non-zero)."""
    generator = torch.Generator().manual_seed(3)
    shapes = {key: value.shape for key, value in _tiny_qlora("meta").state_dict().items()}
    return {key: torch.randn(shape, generator=generator) * 0.05 for key, shape in shapes.items()}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=generator)
    return tokens, torch.randint(0, VOCAB, (2, 12), generator=generator)


def _forward_backward(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, labels = _inputs()
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    return logits.detach(), loss.detach()


def _unshardable_error() -> str:
    with torch.device("meta"):
        model = nn.Module()
        # 2 x 96: whole rows for 2 ranks, but 3 blocks form a single group of block scales
        model.layers = nn.ModuleList([LoRALinear(96, 2, rank=2, alpha=4.0, quantize_base=True)])
    from tune.training import shard_model

    try:
        shard_model(model)
    except NF4ShardingError as err:
        return str(err)
    return "no error"


def _worker(rank: int, port: int, checkpoint: dict, result_path: str) -> None:
    from tune.modules import TransformerSelfAttentionLayer
    from tune.training import gather_cpu_state_dict, init_distributed, load_from_full_model_state_dict, shard_model

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    init_distributed(backend="gloo")
    model = _tiny_qlora("meta")
    shard_model(model, [TransformerSelfAttentionLayer])  # failed here in torchao's NF4 split before the fix
    load_from_full_model_state_dict(
        model, checkpoint, strict=True
    )  # adapters too, so every key comes from the checkpoint
    logits, loss = _forward_backward(model)  # every rank runs the same batch: gradients average to the batch's
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.grad is not None}
    state = gather_cpu_state_dict(model)
    error = _unshardable_error()
    if rank == 0:
        result = {"logits": logits, "loss": loss, "grads": grads, "state": state, "error": error}
        torch.save(result, result_path)
    torch.distributed.destroy_process_group()


def test_tiny_qlora_model_shards_on_two_ranks_and_matches_one_process(tmp_path):
    """Tiny-dimension QLoRA (NF4 q/k/v/output, MLP and output layers) under FSDP2 on 2 gloo ranks: forward, loss
    and adapter gradients equal the unsharded model's; gathered weights are its dequantised NF4 weights; a
    weight with a single scale group is refused with one line."""
    checkpoint = _tiny_checkpoint()
    reference = _tiny_qlora("cpu")
    reference.load_state_dict(checkpoint)
    want_logits, want_loss = _forward_backward(reference)

    result_path = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(free_port(), checkpoint, str(result_path)), nprocs=WORLD)
    got = torch.load(result_path, weights_only=True)

    print(f"2 ranks vs 1 process: |loss diff| {abs(got['loss'] - want_loss).item():.1e}")
    torch.testing.assert_close(got["logits"], want_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got["loss"], want_loss, atol=1e-6, rtol=0)
    want_grads = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
    assert got["grads"].keys() == want_grads.keys() and len(want_grads) == 2 * 2 * (4 + 3) + 2  # A, B per adapter
    for name, grad in want_grads.items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    want_state = {key: dequantize(value) for key, value in reference.state_dict().items()}
    assert got["state"].keys() == want_state.keys()
    for key, value in want_state.items():  # NF4 shards gather back to exactly the single-process dequantisation
        torch.testing.assert_close(got["state"][key], value, atol=0, rtol=0, msg=key)
    error = got["error"]
    assert "'layers.0.weight'" in error and "shape (2, 96)" in error and "over 2 ranks" in error, error
    assert "\n" not in error
