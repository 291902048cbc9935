"""ShardedRecipeState and the LoRA helpers of tune.training: a sharded save read back into a fresh model, optimizer,
sampler and RNG equals what was saved; a LoRA run keeps only its adapters in the sharded state and writes the
adapter and the merged model as its output.

The distributed paths run for real on a one-process gloo group; the recipes' 2-rank runs (tests/recipes) check the
same object against one device.
"""

import random

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tune.modules.peft import LoRALinear, get_merged_lora_ckpt, is_adapter_key
from tune.training import (
    ShardedRecipeState,
    init_device_mesh,
    init_distributed,
    load_lora_state_dicts,
    lora_checkpoint_payload,
    prepare_lora_model,
    shard_model,
)
from tune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    MODEL_KEY,
    FullModelTorchTuneCheckpointer,
    StatefulDistributedSampler,
)


@pytest.fixture
def process_group():
    init_distributed(backend="gloo")  # one process: the collectives of the sharded paths run for real
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


class _Block(nn.Module):
    def __init__(self, lora: bool) -> None:
        super().__init__()
        self.proj = LoRALinear(4, 4, rank=2, alpha=4.0) if lora else nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.proj(x))


class _Model(nn.Module):
    def __init__(self, lora: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(lora), _Block(lora)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _base_files(tmp_path):
    directory = tmp_path / "base"
    directory.mkdir()
    torch.manual_seed(1)
    save_file({k: v for k, v in _Model().state_dict().items()}, directory / "model.safetensors")
    return directory


def _run(tmp_path, lora, seed=0, resume=False):
    """A sharded model, its optimizer, sampler and scheduler and the recipe state over them."""
    torch.manual_seed(seed)
    model = _Model(lora)
    if lora:
        for layer in model.layers:  # non-zero B: a merge changes the weights
            nn.init.normal_(layer.proj.lora_b.weight)
        _, adapter_config = prepare_lora_model(model)
    else:
        adapter_config = None
    shard_model(model, dp_mesh=init_device_mesh(1, 1, "cpu")["dp_shard"])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    sampler = StatefulDistributedSampler(list(range(16)), num_replicas=1, rank=0, shuffle=True, seed=3)
    checkpointer = FullModelTorchTuneCheckpointer(
        checkpoint_dir=tmp_path / "base", checkpoint_files=["model.safetensors"], output_dir=tmp_path / "out"
    )
    state = ShardedRecipeState(
        model,
        optimizer,
        checkpointer=checkpointer,
        output_dir=tmp_path / "out",
        sampler=sampler,
        seed=3,
        epochs=2,
        steps_per_epoch=4,
        max_steps_per_epoch=None,
        samples_per_step=2,
        lr_scheduler=scheduler,
        adapter_config=adapter_config,
        resume_from_checkpoint=resume,
    )
    return model, optimizer, scheduler, sampler, state


def _train_one_step(model, optimizer, scheduler):
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def _full(model):
    from tune.training import gather_cpu_state_dict

    return gather_cpu_state_dict(model, is_rank_zero=True)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_restore_gives_back_weights_optimizer_progress_and_rng(tmp_path, process_group, lora):
    _base_files(tmp_path)
    model, optimizer, scheduler, sampler, state = _run(tmp_path, lora)
    _train_one_step(model, optimizer, scheduler)
    state.save(epoch=0, epochs_run=0, global_step=1, config={"seed": 3})
    sharded = tmp_path / "out" / "dcp" / "step_1"
    assert (sharded / ".complete").is_file()
    rng_after_save = (torch.rand(2), random.random())

    fresh, fresh_optimizer, fresh_scheduler, _, resumed = _run(tmp_path, lora, seed=5, resume=True)
    assert resumed.restore(seed=None) == (0, 1, 3)
    trained, restored = _full(model), _full(fresh)
    for key in trained:
        if not lora or is_adapter_key(key):  # a LoRA run's base weights come from checkpoint_dir, not the shards
            torch.testing.assert_close(restored[key], trained[key], rtol=0, atol=0, msg=key)
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    saved_moments = [s["exp_avg"].full_tensor() for s in optimizer.state.values()]
    restored_moments = [s["exp_avg"].full_tensor() for s in fresh_optimizer.state.values()]
    for expected, actual in zip(saved_moments, restored_moments, strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    # the RNG states are the saved ones: the next draws equal those the first run made after saving
    assert torch.equal(torch.rand(2), rng_after_save[0]) and random.random() == rng_after_save[1]


def test_a_lora_run_shards_only_its_adapters_and_writes_the_adapter_and_merged_model(tmp_path, process_group):
    from torch.distributed.checkpoint import FileSystemReader

    _base_files(tmp_path)
    model, optimizer, scheduler, _, state = _run(tmp_path, lora=True)
    _train_one_step(model, optimizer, scheduler)
    state.save(epoch=0, epochs_run=0, global_step=1, config=None)
    saved = FileSystemReader(str(tmp_path / "out" / "dcp" / "step_1")).read_metadata().state_dict_metadata
    weights = [key.removeprefix(f"{MODEL_KEY}.") for key in saved if key.startswith(f"{MODEL_KEY}.")]
    assert weights and all(is_adapter_key(key) for key in weights)

    output = tmp_path / "out" / "step_1"
    merged = load_file(output / "model.safetensors")
    expected = get_merged_lora_ckpt(_full(model), rank=2, alpha=4.0)
    assert merged.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], rtol=0, atol=0, msg=key)
    # the torchtune-format checkpointer writes the adapter and its config beside the model, under adapter/
    adapter_files = sorted(path.name for path in (output / "adapter").iterdir())
    assert adapter_files == ["adapter_config.json", "adapter_model.safetensors"]


def test_the_last_step_writes_the_output_and_no_sharded_state(tmp_path, process_group):
    _base_files(tmp_path)
    model, optimizer, scheduler, _, state = _run(tmp_path, lora=False)
    _train_one_step(model, optimizer, scheduler)
    state.save(epoch=1, epochs_run=2, global_step=8, config=None)  # 2 epochs x 4 steps: the run is over
    assert (tmp_path / "out" / "step_8" / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "dcp" / "step_8").exists()


def test_resuming_without_a_sharded_checkpoint_says_how_to_start_afresh(tmp_path, process_group):
    _base_files(tmp_path)
    with pytest.raises(ValueError, match="resume_from_checkpoint: false"):
        _run(tmp_path, lora=False, resume=True)


def test_prepare_lora_model_trains_only_the_adapters_and_names_the_fixes_when_there_are_none():
    model = _Model(lora=True)
    params, adapter_config = prepare_lora_model(model)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == set(params)
    assert all(is_adapter_key(name) for name in params) and (adapter_config["r"], adapter_config["lora_alpha"]) == (
        2,
        4.0,
    )
    with pytest.raises(ValueError, match="LoRAConverter to model_converters or use full_finetune_distributed"):
        prepare_lora_model(_Model(lora=False), full_recipe="full_finetune_distributed")
    with pytest.raises(ValueError) as error:
        prepare_lora_model(_Model(lora=False), model_converters=False)
    assert "LoRAConverter" not in str(error.value)


def test_load_lora_state_dicts_refuses_a_base_checkpoint_of_another_model():
    model = _Model(lora=True)
    base = {key: value for key, value in _Model().state_dict().items()}
    base = {key.replace("proj.weight", "proj.base_weight_other"): value for key, value in base.items()}
    with pytest.raises(ValueError, match="missing base key"):
        load_lora_state_dicts(model, base)


def test_lora_checkpoint_payload_is_the_adapter_its_config_and_the_merged_model():
    model = _Model(lora=True)
    nn.init.normal_(model.layers[0].proj.lora_b.weight)
    _, adapter_config = prepare_lora_model(model)
    payload = lora_checkpoint_payload(model.state_dict(), adapter_config)
    assert set(payload) == {ADAPTER_KEY, ADAPTER_CONFIG, MODEL_KEY}
    assert all(is_adapter_key(key) for key in payload[ADAPTER_KEY]) and payload[ADAPTER_CONFIG]["r"] == 2
    assert not any(is_adapter_key(key) for key in payload[MODEL_KEY])
    assert set(lora_checkpoint_payload(model.state_dict(), adapter_config, adapter_only=True)) == {
        ADAPTER_KEY,
        ADAPTER_CONFIG,
    }
