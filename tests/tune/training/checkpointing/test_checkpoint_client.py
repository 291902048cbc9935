"""CheckpointClient and TrainingProgress (torchtune's config-driven client): a save read back by a new client.

A tiny model trained one AdamW step is saved through the checkpointer its config names, then loaded by a second
client built as a resumed run would build it; the weights, the optimizer state and the progress must come back
as they were saved.
"""

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file
from torch import nn

from tune.modules.peft import LoRALinear, get_adapter_params
from tune.training import init_distributed
from tune.training.checkpointing import (
    DATALOADER_KEY,
    EPOCHS_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
)
from tune.training.checkpointing._checkpoint_client import CheckpointClient, TrainingProgress

DATALOADER_STATE = {"sampler": {"epoch": 0, "samples_seen": 8}}


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _trained_one_step(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return optimizer


def _config(tmp_path, **top):
    checkpoint_dir = tmp_path / "base"
    checkpoint_dir.mkdir(exist_ok=True)
    save_file(_model(seed=1).state_dict(), checkpoint_dir / "model.safetensors")
    checkpointer = {
        "_component_": "tune.training.FullModelTorchTuneCheckpointer",
        "checkpoint_dir": str(checkpoint_dir),
        "checkpoint_files": ["model.safetensors"],
        "output_dir": str(tmp_path / "out"),
    }
    return OmegaConf.create({"checkpointer": checkpointer, "device": "cpu", **top})


def _progress(epochs_run=1, total_epochs=2):
    return TrainingProgress(
        seed=7,
        epochs_run=epochs_run,
        total_epochs=total_epochs,
        max_steps_per_epoch=4,
        dataloader_state_dict=DATALOADER_STATE,
    )


def _assert_same_tensors(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0, msg=key)


def _assert_same_adam_state(loaded, optimizer):
    # loaded: keyed by parameter index (a plain optimizer.state_dict()) or by parameter name (a gathered one)
    saved = list(optimizer.state_dict()["state"].values())
    got = list(loaded["state"].values())
    assert len(got) == len(saved)
    for expected, actual in zip(saved, got, strict=True):
        for name in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0)


def test_training_progress_state_dict_uses_the_recipe_state_keys():
    state = _progress().state_dict()
    assert state == {
        SEED_KEY: 7,
        EPOCHS_KEY: 1,
        TOTAL_EPOCHS_KEY: 2,
        MAX_STEPS_KEY: 4,
        DATALOADER_KEY: DATALOADER_STATE,
    }
    with_steps = TrainingProgress(seed=0, epochs_run=0, total_epochs=1, max_steps_per_epoch=None, steps_run=5)
    assert with_steps.state_dict()[STEPS_KEY] == 5 and with_steps.state_dict()[DATALOADER_KEY] is None


def test_intermediate_save_is_resumed_by_a_new_client(tmp_path):
    model = _model()
    optimizer = _trained_one_step(model)
    client = CheckpointClient(_config(tmp_path))
    client.save_checkpoint(model, optimizer, _progress(), epoch=0, single_device=True)
    saved = tmp_path / "out" / "epoch_0"
    assert (saved / "recipe_state.pt").is_file() and (saved / ".complete").is_file()

    resumed = CheckpointClient(_config(tmp_path, resume_from_checkpoint=True)).load_base_checkpoint()
    _assert_same_tensors(resumed[MODEL_KEY], model.state_dict())
    _assert_same_adam_state(resumed[OPT_KEY], optimizer)
    assert {key: resumed[key] for key in _progress().state_dict()} == _progress().state_dict()
    fresh = _model(seed=2)
    fresh.load_state_dict(resumed[MODEL_KEY])
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_optimizer.load_state_dict(resumed[OPT_KEY])  # the saved state is what the optimizer loads


def test_last_epoch_saves_the_model_without_recipe_state(tmp_path):
    model = _model()
    optimizer = _trained_one_step(model)
    client = CheckpointClient(_config(tmp_path))
    client.save_checkpoint(model, optimizer, _progress(epochs_run=2), epoch=1, single_device=True)
    saved = tmp_path / "out" / "epoch_1"
    assert (saved / "model.safetensors").is_file() and not (saved / "recipe_state.pt").exists()
    # nothing to resume from: only intermediate checkpoints count
    with pytest.raises(ValueError, match="no complete intermediate checkpoint"):
        CheckpointClient(_config(tmp_path, resume_from_checkpoint=True)).load_base_checkpoint()


@pytest.fixture
def process_group():
    init_distributed(backend="gloo")  # one process: the collectives of the distributed paths run for real
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_gathered_save_round_trips_through_the_checkpointer(tmp_path, process_group):
    model = _model()
    optimizer = _trained_one_step(model)
    CheckpointClient(_config(tmp_path)).save_checkpoint(model, optimizer, _progress(), epoch=0)
    resumed = CheckpointClient(_config(tmp_path, resume_from_checkpoint=True)).load_base_checkpoint()
    _assert_same_tensors(resumed[MODEL_KEY], model.state_dict())
    _assert_same_adam_state(resumed[OPT_KEY], optimizer)
    assert resumed[OPT_KEY]["state"].keys() == dict(model.named_parameters()).keys()  # keyed by name


def test_async_checkpointing_saves_shards_that_load_distributed_checkpoint_restores(tmp_path, process_group):
    model = _model()
    optimizer = _trained_one_step(model)
    cfg = _config(tmp_path, enable_async_checkpointing=True)
    CheckpointClient(cfg).save_checkpoint(model, optimizer, _progress(), epoch=0)
    assert (tmp_path / "out" / "dcp" / "epoch_0" / ".complete").is_file()
    assert not (tmp_path / "out" / "epoch_0").exists()  # the configured checkpointer wrote nothing

    fresh = _model(seed=2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    resumed_cfg = _config(tmp_path, enable_async_checkpointing=True, resume_from_checkpoint=True)
    state = CheckpointClient(resumed_cfg).load_distributed_checkpoint(fresh, fresh_optimizer)
    _assert_same_tensors(fresh.state_dict(), model.state_dict())
    _assert_same_adam_state(fresh_optimizer.state_dict(), optimizer)
    assert (state[SEED_KEY], state[EPOCHS_KEY], state[TOTAL_EPOCHS_KEY], state[MAX_STEPS_KEY]) == (7, 1, 2, 4)


def test_load_distributed_checkpoint_without_one_says_how_to_start_afresh(tmp_path, process_group):
    model = _model()
    client = CheckpointClient(_config(tmp_path, enable_async_checkpointing=True, resume_from_checkpoint=True))
    with pytest.raises(ValueError, match="resume_from_checkpoint=False"):
        client.load_distributed_checkpoint(model, torch.optim.AdamW(model.parameters()))


def test_adapter_only_save_writes_the_adapter_alone(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(LoRALinear(4, 8, rank=2, alpha=4.0), nn.ReLU(), nn.Linear(8, 2))
    nn.init.normal_(model[0].lora_b.weight)  # non-zero, so that a merge would change the weights
    client = CheckpointClient(_config(tmp_path))
    adapter_config = {"r": 2, "lora_alpha": 4.0, "target_modules": ["0"]}
    client.save_checkpoint(
        model, None, _progress(epochs_run=2), epoch=1, adapter_config=adapter_config, adapter_only=True
    )
    saved = tmp_path / "out" / "epoch_1"
    assert not (saved / "model.safetensors").exists()
    adapter = client._get_checkpointer().load_adapter(saved)
    _assert_same_tensors(adapter, {name: p.detach() for name, p in get_adapter_params(model).items()})
    with pytest.raises(ValueError, match="adapter_config"):
        client.save_checkpoint(model, None, _progress(), epoch=0, adapter_only=True)


def test_torchtune_path_is_an_alias_of_the_config_level_module():
    # torchtune recipes import the client from tune.training.checkpointing._checkpoint_client; the class reads a
    # config, so it lives in tune.config (above tune.training) and that path names the same module
    import importlib

    by_torchtune_path = importlib.import_module("tune.training.checkpointing._checkpoint_client")
    module = importlib.import_module("tune.config._checkpoint_client")
    assert by_torchtune_path is module and CheckpointClient is module.CheckpointClient
