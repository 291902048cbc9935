"""The one writer of config.yaml (tune/training/checkpointing/_state.py:save_config), also behind
tune.config.save_config: atomic, and a write that fails names the file and leaves the previous one as it was.

The write is made to fail with a directory in the way of the final rename (an OSError on any filesystem, as root
too); the disk-full case (EFBIG) goes through `tune run` in tests/recipes/test_bad_input.py.
"""

import pytest
import yaml
from omegaconf import OmegaConf

from tune import config
from tune.training.checkpointing import CheckpointSaveError, save_config
from tune.utils import TuneError


def _in_the_way(directory):
    blocker = directory / "config.yaml"
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("not replaced")
    return blocker


def test_save_config_writes_atomically_and_leaves_no_temporary_file(tmp_path):
    path = save_config({"lr": 1e-3, "model": {"dim": 8}}, tmp_path)
    assert path == tmp_path / "config.yaml"
    assert yaml.safe_load(path.read_text()) == {"lr": 1e-3, "model": {"dim": 8}}
    save_config("lr: 2.0e-3\n", tmp_path)  # replaces it
    assert yaml.safe_load(path.read_text()) == {"lr": 2e-3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_save_config_that_cannot_write_names_the_file(tmp_path):
    blocker = _in_the_way(tmp_path)
    with pytest.raises(OSError, match=rf"^could not write {blocker}: \[Errno 21\] Is a directory"):
        save_config({"lr": 1e-3}, tmp_path)
    assert (blocker / "keep").read_text() == "not replaced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # the temporary file was removed


def test_tune_config_save_config_failure_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    cfg = OmegaConf.create({"output_dir": str(tmp_path), "lr": 1e-3})
    blocker = _in_the_way(tmp_path)
    with pytest.raises(CheckpointSaveError) as info:
        config.save_config(cfg, tmp_path)
    assert isinstance(info.value, TuneError)  # printed by the CLI as one error line
    message = str(info.value)
    assert message.startswith(f"Could not write the run's config {blocker}: [Errno 21] Is a directory")
    assert f"the checkpoints in {tmp_path} are as they were" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
