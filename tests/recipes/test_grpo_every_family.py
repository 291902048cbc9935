"""Every shipped GRPO config trains (slow tier): configs/<family>/<size>_{full,lora}_grpo_single_device.yaml and the
distributed configs/<family>/<size>_full_grpo.yaml (on 2 gloo ranks), copied as shipped, run for 2 steps on the
family's tiny checkpoint and tokenizer (tests/recipes/_family_assets.py) with prompt rows "a + b =" in place of
GSM8K, then the outputs load in transformers (and PEFT for LoRA).
"""

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes.dist_utils import run_distributed
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

DIST_CASES = sorted(
    (path.parent.name, f"{path.parent.name}/{path.name}") for path in (ROOT / "configs").glob("*/*_full_grpo.yaml")
)


def test_every_family_with_grpo_configs_has_both_recipes():
    assert {(family, method) for family, method, _ in CASES} == {
        (family, method) for family in ("llama3_2", "qwen2_5", "qwen3") for method in ("full", "lora")
    }
    assert [family for family, _ in DIST_CASES] == ["llama3_2", "qwen2_5", "qwen3"]


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
        *_rewards_with_a_spread(config),
    ]
    run_recipe(f"grpo_{method}_finetune_single_device", config, overrides, cwd=tmp_path, timeout=300)
    _check_steps(out)
    final = out / f"step_{STEPS}"
    if lora is None:
        _load_strict(final)
        _check_moved(final, data / "hf")
    else:
        _check_peft(family, method, data, final, lora)


@pytest.mark.slow
@pytest.mark.parametrize("family, relative", DIST_CASES)
def test_shipped_distributed_grpo_config_trains_and_loads_in_hf(family_assets, tmp_path, family, relative):  # noqa: F811
    """The full_grpo configs (grpo_full_finetune_distributed) on 2 gloo ranks, one prompt per rank."""
    data = family_assets(family)
    config = _copy_config(relative, tmp_path)
    out = tmp_path / "run"
    prompts = write_sum_prompts(tmp_path / "prompts.json", num=8)
    skipped = ("dataset.", "max_steps_per_epoch=", "save_every_n_steps=", "batch_size=")
    overrides = [o for o in _overrides(family, "full", data, out, None) if not o.startswith(skipped)]
    overrides += [
        "dataset._component_=tune.datasets.prompt_dataset",
        "dataset.source=json",
        f"dataset.data_files={prompts}",
        "dataset.split=train",
        "batch_size=1",  # per rank
        "grpo_samples=2",
        "forward_batch_size=2",
        "max_generated_tokens=4",
        f"max_steps_per_epoch={STEPS}",
        "loss.beta=0.04",  # the reference runs too: a frozen copy of the starting model, sharded like the policy
        *_rewards_with_a_spread(config),
    ]
    run_distributed("grpo_full_finetune_distributed", config, overrides, cwd=tmp_path)
    _check_steps(out)
    _load_strict(out / f"step_{STEPS}")
    _check_moved(out / f"step_{STEPS}", data / "hf")


def _rewards_with_a_spread(config) -> list[str]:
    """The shipped reward functions and weights plus ``completion_length`` (tests/recipes/assets/grpo_components.py,
    weight 0.5): the tiny random model never answers nor writes the format, so the shipped rewards alone give every
    completion 0, the advantages are 0 and the steps would leave the weights as they were."""
    shipped = yaml.safe_load(config.read_text())
    functions = [*shipped["reward_functions"], "grpo_components.completion_length"]
    weights = [*shipped["reward_weights"], 0.5]
    return [f"reward_functions={json.dumps(functions)}", f"reward_weights={json.dumps(weights)}"]


def _check_steps(out) -> None:
    """The run logged steps 1..STEPS, each with a finite loss, reward and KL, and took a gradient step."""
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert all(torch.isfinite(torch.tensor(record[k])) for k in ("loss", "reward", "kl", "grad_norm"))
    assert max(r["grad_norm"] for r in records) > 0, records


def _check_moved(final, initial) -> None:
    """The trained checkpoint holds the initial one's tensors, and the steps changed them."""
    trained, start = load_file(final / "model.safetensors"), load_file(initial / "model.safetensors")
    assert trained.keys() == start.keys()
    assert max((trained[k] - start[k]).abs().max().item() for k in start) > 0
