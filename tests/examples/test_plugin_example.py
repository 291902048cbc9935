"""The worked plugin (examples/plugin): installed with pip into a temporary folder, then found through its
``tune.plugins`` entry points by ``tune ls``, ``tune run`` and ``tune.config.instantiate``."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tune import config, plugins, training

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the installed distribution (package + dist-info with its entry points)."""
    target = tmp_path_factory.mktemp("plugin_site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(PLUGIN),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (target / "tune_plugin_example" / "configs" / "tune_example" / "tiny.yaml").is_file()
    return target


def _tune(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "tune._cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_tune_ls_lists_the_plugin_recipe_with_its_config(site, tmp_path):
    result = _tune(site, tmp_path, "ls", "tune_example")
    assert result.returncode == 0, result.stderr
    assert re.search(r"tune_example_train \(plugin\)\s+no\s+tune_example/tiny", result.stdout), result.stdout


def test_tune_run_runs_the_plugin_recipe_with_the_plugins_dataset_and_converter(site, tmp_path):
    result = _tune(site, tmp_path, "run", "tune_example_train", "--config", "tune_example/tiny")
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"tune_example_train: steps=40 loss=([\d.]+) accuracy=([\d.]+)", result.stdout)
    assert found, result.stdout + result.stderr[-2000:]
    # 40 Adam steps learn the 32-entry rule of the plugin's dataset (measured: loss 0.06, accuracy 1.000)
    assert float(found.group(2)) > 0.9 and float(found.group(1)) < 0.5


def test_plugin_components_are_instantiated_by_entry_point_name(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    plugins._reset_for_tests()  # entry points are discovered once per process: look again with the plugin
    try:
        dataset = config.instantiate(
            {"_component_": "tune_example_dataset", "num_samples": 3, "seq_len": 5, "vocab_size": 8}
        )
        sample = dataset[0]
        # the dataset's rule: token[t + 1] = (5 * token[t] + 3) mod 8; the first label is ignored
        assert all(b == (5 * a + 3) % 8 for a, b in zip(sample["tokens"], sample["tokens"][1:]))
        assert sample["labels"][0] == -100 and sample["labels"][1:] == sample["tokens"][1:]
        converters = config.instantiate([{"_component_": "tune_example_max_norm", "max_norm": 0.5}])
        assert type(converters[0]).__module__ == "tune_plugin_example.converters"
        training.validate_converter_order([converters[0], training.QATConverter(32)])  # no constraints declared
        torch.manual_seed(0)
        model = training.apply_model_converters(nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 1)), converters)
        assert model[0].weight.norm(dim=-1).max() <= 0.5 + 1e-6  # convert() applies the constraint at once
        optimizer = torch.optim.SGD(model.parameters(), lr=10.0)
        training.register_post_optimizer_hooks(optimizer, model, converters)
        model(torch.arange(8)).sum().backward()
        optimizer.step()  # a step of lr 10 pushes rows far out; the hook brings them back
        assert model[0].weight.norm(dim=-1).max() <= 0.5 + 1e-6
    finally:
        plugins._reset_for_tests()
        for name in [n for n in sys.modules if n.startswith("tune_plugin_example")]:
            del sys.modules[name]
