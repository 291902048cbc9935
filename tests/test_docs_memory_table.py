"""docs/memory_table.md is what tools/memory_table.py writes from `tune estimate`: every shipped training config
is listed, and its rows hold the estimates the configs give today (a sample of rows in the default tier, the whole
page in the slow one)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a spread of recipes and methods: single-device full/LoRA/QLoRA, distributed, DPO, KD, PPO, a 70B config
SAMPLE = [
    "llama3_2/1B_full_single_device",
    "llama3_2/1B_lora_single_device",
    "qwen2_5/0.5B_qlora_single_device",
    "llama3_1/70B_lora",
    "llama3_2/1B_lora_dpo_single_device",
    "llama3_2/8B_to_1B_KD_lora_single_device",
    "llama3_2/1B_full_ppo_single_device",
]


def _tool():
    spec = importlib.util.spec_from_file_location("memory_table", REPO / "tools" / "memory_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(text: str) -> dict[str, str]:
    return {
        line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ") and "/" in line
    }


def test_every_shipped_training_config_is_listed():
    tool = _tool()
    rows = _rows(tool.TABLE.read_text(encoding="utf-8"))
    expected = [config for config, _ in tool.training_configs()]
    assert sorted(rows) == expected, "docs/memory_table.md is stale: run python tools/memory_table.py"
    # only a builder that reads a downloaded file (Phi-3 128k's config.json) cannot be built without it
    missing = [r for r in rows.values() if "not estimated" in r]
    assert all("FileNotFoundError" in r for r in missing), missing
    assert len(missing) <= 3


def test_sampled_rows_are_current():
    tool = _tool()
    rows = _rows(tool.TABLE.read_text(encoding="utf-8"))
    recipes = dict(tool.training_configs())
    for config in SAMPLE:
        assert config in rows, config
        assert rows[config] == tool.row(config, recipes[config]), "run python tools/memory_table.py"


@pytest.mark.slow
def test_the_whole_table_is_current():
    tool = _tool()
    assert tool.TABLE.read_text(encoding="utf-8") == tool.render(), "run python tools/memory_table.py"
