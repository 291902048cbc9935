"""Checkpoint files a user got wrong: every one is a CheckpointError (a TuneError: one `error:` line at the CLI)
naming the file; a save that fails on an OS error is a CheckpointSaveError naming output_dir and the intact
previous checkpoint, with the partial directory removed."""

import os

import pytest
import torch

from tests.tune.training.checkpointing.tiny_llama import FAMILY
from tune.training.checkpointing import FullModelHFCheckpointer, load_recipe_state
from tune.training.checkpointing._io import CheckpointError, CheckpointSaveError, save_safetensors
from tune.training.checkpointing._layout import atomic_checkpoint_dir, list_complete_checkpoints
from tune.utils import TuneError


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/tune_pwned_by_pickle",))


def _truncate_shards(hf_dir):
    shard = sorted(hf_dir.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return shard


def _pickle_with_code(hf_dir):
    for shard in hf_dir.glob("*.safetensors"):
        shard.unlink()
    (hf_dir / "model.safetensors.index.json").unlink()
    torch.save({"model.embed_tokens.weight": _RunsCode()}, hf_dir / "pytorch_model.bin")
    return hf_dir / "pytorch_model.bin"


def _config_not_json(hf_dir):
    (hf_dir / "config.json").write_text('{"hidden_size": 64,\n "num_layers": }')
    return hf_dir / "config.json"


def _index_not_json(hf_dir):
    (hf_dir / "model.safetensors.index.json").write_text("{")
    return hf_dir / "model.safetensors.index.json"


@pytest.mark.parametrize(
    "damage, expected",
    [
        (_truncate_shards, "Could not read the safetensors (file|header)"),
        (_pickle_with_code, "Refused to load .*never unpickles"),
        (_config_not_json, r"is not valid JSON \(line 2, column 16"),
        (_index_not_json, r"is not valid JSON \(line 1"),
    ],
    ids=["truncated_safetensors", "pickle_with_code", "config_json", "index_json"],
)
def test_bad_checkpoint_file_is_one_error_naming_it(hf_dir, tmp_path, damage, expected):
    path = damage(hf_dir)
    with pytest.raises(CheckpointError, match=expected) as info:
        FullModelHFCheckpointer(hf_dir, model_type=FAMILY, output_dir=tmp_path / "out").load_checkpoint()
    assert str(path) in str(info.value) and isinstance(info.value, TuneError)
    assert "\n" not in str(info.value)
    assert not os.path.exists("/tmp/tune_pwned_by_pickle")


def test_missing_checkpoint_file(hf_dir, tmp_path):
    with pytest.raises(CheckpointError, match=f"Checkpoint files not found in {hf_dir}: nope.safetensors"):
        FullModelHFCheckpointer(
            hf_dir, checkpoint_files=["nope.safetensors"], model_type=FAMILY, output_dir=tmp_path / "out"
        )


def test_recipe_state_from_another_program(tmp_path):
    path = tmp_path / "recipe_state.pt"
    torch.save({"epochs_run": 1}, path)
    with pytest.raises(CheckpointError, match=r"recipe_state.pt is not a recipe state .* lacks \['rng_state'\]"):
        load_recipe_state(path, required=("rng_state",))
    assert load_recipe_state(path) == {"epochs_run": 1}


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    with atomic_checkpoint_dir(tmp_path, "step_1", {"recipe_state": True}) as directory:
        save_safetensors({"w": torch.ones(2)}, directory / "model.safetensors")
    with pytest.raises(CheckpointSaveError) as info:
        with atomic_checkpoint_dir(tmp_path, "step_2", {"recipe_state": True}) as directory:
            (directory / "blocker").write_text("")
            # a real OS error (ENOTDIR) in the middle of the save, as a full disk gives ENOSPC
            save_safetensors({"w": torch.ones(2)}, directory / "blocker" / "model.safetensors")
    message = str(info.value)
    assert f"Could not save checkpoint step_2 to output_dir {tmp_path}" in message
    assert f"The previous checkpoint {tmp_path / 'step_1'} is intact" in message and "\n" not in message
    assert isinstance(info.value, TuneError) and isinstance(info.value, OSError)
    assert [path.name for path, _ in list_complete_checkpoints(tmp_path)] == ["step_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # the temporary directory is gone
