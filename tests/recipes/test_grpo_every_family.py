"""Every shipped GRPO config trains (slow tier): configs/<family>/<size>_{full,lora}_grpo_single_device.yaml, copied
as shipped, run for 2 steps on the family's tiny checkpoint and tokenizer (tests/recipes/_family_assets.py) with
prompt rows "a + b =" in place of GSM8K, then the outputs load in transformers (and PEFT for LoRA).
"""

import pytest
import torch

from tests.recipes.test_every_family import (  # noqa: F401 - family_assets is a fixture
    _check_peft,
    _copy_config,
    _initial_adapter,
    _load_strict,
    _lora_node,
    _overrides,
    family_assets,
)
from tests.recipes.test_grpo_full_finetune_single_device import write_sum_prompts
from tests.recipes.utils import ROOT, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

STEPS = 2
CASES = sorted(
    (path.parent.name, path.stem.split("_")[1], f"{path.parent.name}/{path.name}")
    for path in (ROOT / "configs").glob("*/*_grpo_single_device.yaml")
)


def test_every_family_with_grpo_configs_has_both_recipes():
    assert {(family, method) for family, method, _ in CASES} == {
        (family, method) for family in ("llama3_2", "qwen2_5", "qwen3") for method in ("full", "lora")
    }


@pytest.mark.slow
@pytest.mark.parametrize("family, method, relative", CASES)
def test_shipped_grpo_config_trains_and_loads_in_hf(family_assets, tmp_path, family, method, relative):  # noqa: F811
    data = family_assets(family)
    config = _copy_config(relative, tmp_path)
    lora = _lora_node(config) if method == "lora" else None
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter") if lora else None
    out = tmp_path / "run"
    prompts = write_sum_prompts(tmp_path / "prompts.json", num=8)
    skipped = ("dataset.", "max_steps_per_epoch=", "save_every_n_steps=", "batch_size=")
    overrides = [o for o in _overrides(family, method, data, out, adapter) if not o.startswith(skipped)]
    overrides += [
        "dataset._component_=tune.datasets.prompt_dataset",
        "dataset.source=json",
        f"dataset.data_files={prompts}",
        "dataset.split=train",
        "batch_size=2",
        "grpo_samples=2",
        "forward_batch_size=4",
        "max_generated_tokens=4",
        f"max_steps_per_epoch={STEPS}",
        "loss.beta=0.04",  # the reference runs too: a frozen copy (full) or the adapters disabled (LoRA)
    ]
    run_recipe(f"grpo_{method}_finetune_single_device", config, overrides, cwd=tmp_path, timeout=300)
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert all(torch.isfinite(torch.tensor(record[k])) for k in ("loss", "reward", "kl"))
    final = out / f"step_{STEPS}"
    if lora is None:
        _load_strict(final)
    else:
        _check_peft(family, method, data, final, lora)
