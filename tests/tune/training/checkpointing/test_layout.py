import json
import random

import numpy as np
import pytest
import torch

from tune.training.checkpointing import (
    checkpoint_dir_name,
    config_to_yaml,
    find_latest_checkpoint,
    get_rng_state,
    list_complete_checkpoints,
    load_recipe_state,
    prune_checkpoints,
    save_config,
    save_recipe_state,
    set_rng_state,
    should_save_checkpoint,
)
from tune.training.checkpointing._layout import atomic_checkpoint_dir


def _save(output_dir, name, recipe_state=True):
    with atomic_checkpoint_dir(output_dir, name, {"recipe_state": recipe_state, "format": "hf"}) as directory:
        (directory / "weights").write_text(name)
    return output_dir / name


def test_names_and_save_policy():
    assert checkpoint_dir_name(epoch=2) == "epoch_2"
    assert checkpoint_dir_name(epoch=2, step=40) == "step_40"
    with pytest.raises(ValueError, match="epoch.*step"):
        checkpoint_dir_name()
    # save_every_n_steps=3: after steps 3, 6, 9 of 1..10
    assert [s for s in range(1, 11) if should_save_checkpoint(s, 3)] == [3, 6, 9]
    assert not any(should_save_checkpoint(s, None) for s in range(1, 11))
    with pytest.raises(ValueError, match="save_every_n_steps"):
        should_save_checkpoint(1, 0)


def test_latest_complete_checkpoint_ignores_incomplete_and_temporary(tmp_path):
    _save(tmp_path, "step_2")
    _save(tmp_path, "step_4")
    _save(tmp_path, "epoch_1", recipe_state=False)  # a final checkpoint: not resumable
    (tmp_path / "step_6").mkdir()  # a directory without the .complete marker
    (tmp_path / ".tmp_step_8").mkdir()
    assert find_latest_checkpoint(tmp_path) == tmp_path / "step_4"
    assert find_latest_checkpoint(tmp_path, require_recipe_state=False) == tmp_path / "epoch_1"
    assert find_latest_checkpoint(tmp_path, format_name="dcp") is None
    assert find_latest_checkpoint(tmp_path / "nothing_here") is None


def test_failed_block_publishes_nothing(tmp_path):
    _save(tmp_path, "step_1")
    with pytest.raises(RuntimeError):
        with atomic_checkpoint_dir(tmp_path, "step_2", {}) as directory:
            (directory / "half").write_text("x")
            raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    _save(tmp_path, "step_1")
    with atomic_checkpoint_dir(tmp_path, "step_1", {"recipe_state": True}) as directory:
        (directory / "weights").write_text("second")
    assert (tmp_path / "step_1" / "weights").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_keep_last_n_prunes_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, f"step_{step}")
    removed = prune_checkpoints(tmp_path, 2)
    assert [p.name for p in removed] == ["step_1", "step_2"]
    assert [p.name for p, _ in list_complete_checkpoints(tmp_path)] == ["step_3", "step_4"]
    with pytest.raises(ValueError, match="keep_last_n_checkpoints"):
        prune_checkpoints(tmp_path, 0)


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    save_recipe_state({"rng_state": get_rng_state()}, tmp_path / "recipe_state.pt")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_recipe_state(tmp_path / "recipe_state.pt")["rng_state"])
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_recipe_state_refuses_objects_it_could_not_read_back(tmp_path):
    with pytest.raises(TypeError, match=r"recipe_state\['sampler'\].*weights_only"):
        save_recipe_state({"sampler": object()}, tmp_path / "recipe_state.pt")


def test_config_is_written_resolved(tmp_path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"output_dir": "/tmp/run", "checkpointer": {"output_dir": "${output_dir}"}, "lr": 2e-5})
    save_config(cfg, tmp_path)
    import yaml

    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "output_dir": "/tmp/run",
        "checkpointer": {"output_dir": "/tmp/run"},
        "lr": 2e-5,
    }
    assert config_to_yaml("a: 1") == "a: 1\n"
    with pytest.raises(TypeError, match="mapping"):
        config_to_yaml(3)


def test_marker_is_json_with_save_time(tmp_path):
    path = _save(tmp_path, "step_7")
    marker = json.loads((path / ".complete").read_text())
    assert marker["recipe_state"] is True and marker["saved_at"] > 0
