"""Seed agreement and LoRA/DoRA adapter creation on the meta device (tune/training/_distributed.py), with 2
processes on CPU (gloo): every rank must start from the same adapters, or the shards FSDP keeps of them would
belong to different initialisations."""

import torch
import torch.multiprocessing as mp

from tune.models.llama3 import lora_llama3
from tune.modules.peft import DoRALinear, get_adapter_params
from tune.training import init_adapters, init_distributed, set_seed, sync_seed

WORLD = 2
SIZES = dict(
    vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32, intermediate_dim=48
)


def _adapters_on_meta_model(seed: int, use_dora: bool = False) -> tuple[dict, torch.nn.Module]:
    set_seed(seed)
    with torch.device("meta"):
        model = lora_llama3(["q_proj", "v_proj"], apply_lora_to_mlp=True, use_dora=use_dora, **SIZES)
    count = init_adapters(model, "cpu")
    assert count == 2 * (2 + 3)  # per layer: q_proj, v_proj and the three MLP projections
    return {k: v.detach().clone() for k, v in get_adapter_params(model).items()}, model


def _worker(rank: int, store: str, result_path: str) -> None:
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for with tests running side by side
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    assert init_distributed() is False  # the recipes' call finds the group already initialised
    seed = sync_seed(None)  # drawn on rank 0, received by rank 1
    assert sync_seed(7) == 7
    adapters, _ = _adapters_on_meta_model(seed)
    gathered = [None] * WORLD
    torch.distributed.all_gather_object(gathered, {"seed": seed, "adapters": adapters})
    if rank == 0:
        torch.save(gathered, result_path)
    torch.distributed.destroy_process_group()


def test_ranks_agree_on_the_seed_and_create_identical_adapters(tmp_path):
    result_path = str(tmp_path / "result.pt")
    mp.start_processes(_worker, args=(str(tmp_path / "store"), result_path), nprocs=WORLD, start_method="spawn")
    rank0, rank1 = torch.load(result_path, weights_only=True)
    assert rank0["seed"] == rank1["seed"]
    # the same values on both ranks, and the values one process draws from that seed
    expected, _ = _adapters_on_meta_model(rank0["seed"])
    for key, value in expected.items():
        assert torch.equal(rank0["adapters"][key], value) and torch.equal(rank1["adapters"][key], value), key


def test_init_adapters_leaves_base_weights_on_meta_and_initialises_like_the_layer():
    adapters, model = _adapters_on_meta_model(3)
    q_proj = model.layers[0].attn.q_proj
    assert q_proj.weight.is_meta and not q_proj.lora_a.weight.is_meta  # base weights come from the checkpoint
    assert torch.count_nonzero(adapters["layers.0.attn.q_proj.lora_b.weight"]) == 0  # B starts at zero
    # A is Kaiming-uniform with a = sqrt(5): bound 1 / sqrt(in_dim)
    bound = 1 / SIZES["embed_dim"] ** 0.5
    lora_a = adapters["layers.0.attn.q_proj.lora_a.weight"]
    assert lora_a.abs().max() <= bound and lora_a.std() > bound / 3
    # DoRA: the magnitude is allocated (it is set from the loaded base weight later), and trainable
    _, dora = _adapters_on_meta_model(3, use_dora=True)
    layer = dora.layers[0].attn.q_proj
    assert isinstance(layer, DoRALinear) and not layer.magnitude.is_meta and layer.magnitude.requires_grad
