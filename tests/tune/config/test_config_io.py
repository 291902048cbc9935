"""tune/config/_io.py: the resolved config logged at the start of a run and saved next to the checkpoints."""

import pytest
import yaml
from omegaconf import OmegaConf

from tune.config import ConfigError, log_config, save_config


def _cfg():
    return OmegaConf.create({"output_dir": "/tmp/run", "logs": "${output_dir}/logs", "optimizer": {"lr": 1e-4}})


def test_save_config_writes_the_resolved_config(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    path = save_config(_cfg(), tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "config.yaml"
    assert yaml.safe_load(path.read_text()) == {
        "output_dir": "/tmp/run",
        "logs": "/tmp/run/logs",
        "optimizer": {"lr": 1e-4},
    }
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]  # no temporary file left behind


def test_save_config_writes_only_on_rank_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    path = save_config(_cfg(), tmp_path)
    assert not path.exists()


def test_log_config_logs_the_resolved_yaml(capfd, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    log_config("my_recipe", _cfg())
    err = capfd.readouterr().err
    assert "Running my_recipe with resolved config:" in err
    assert "logs: /tmp/run/logs" in err


def test_unresolvable_interpolation_names_the_key(tmp_path):
    cfg = OmegaConf.create({"a": {"b": "${missing}"}})
    with pytest.raises(ConfigError, match="a.b: cannot resolve"):
        save_config(cfg, tmp_path)
