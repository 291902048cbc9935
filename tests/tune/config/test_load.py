"""read_yaml on files that are not YAML text: one ConfigError naming the file."""

import pytest

from tune.config import TuneError
from tune.config._load import read_yaml


def test_config_that_is_not_text(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"\xff\xfe\x00a: 1\n")
    with pytest.raises(TuneError, match=r"run.yaml: not UTF-8 text \(byte 0\)"):
        read_yaml(path)
