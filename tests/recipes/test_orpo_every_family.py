"""Every shipped ORPO config (tests/recipes/_family_assets.py ``ORPO_CONFIGS``) trains, resumes and loads in
transformers (and PEFT), end to end on its family's tiny assets, as tests/recipes/test_every_family.py runs the DPO
configs: the shipped file copied byte for byte, 4 steps on generated preference pairs (1 pair per micro-batch, the
config's accumulation, schedule and optimizer kept), a run resumed from the step-2 checkpoint ending with the
uninterrupted run's losses and weights. The distributed configs run on 2 gloo ranks. The slow tier (`make test-all`):
the recipes' ORPO math is checked in the default tier by tests/recipes/test_orpo.py.
"""

import math

import pytest

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import run_distributed
from tests.recipes.test_every_family import (  # noqa: F401 (family_assets: the session fixture of tiny assets)
    NUM_STEPS,
    _check_peft,
    _check_resumed,
    _copy_config,
    _crashed_copy,
    _dist_overrides,
    _dpo_overrides,
    _initial_adapter,
    _load_strict,
    _lora_node,
    _losses,
    family_assets,
)
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _overrides(family: str, relative: str, recipe: str, data, out, adapter, config) -> list[str]:
    if recipe == "lora_dpo_single_device":
        return _dpo_overrides(family, "lora", data, out, adapter)
    if recipe == "lora_dpo_distributed":
        return _dist_overrides(family, "lora_dpo", "lora", data, out, adapter, config)
    # full: the DPO overrides but for the reference, which ORPO has none of (ref_checkpointer: null)
    overrides = _dist_overrides(family, "full_dpo", "full", data, out, adapter, config)
    return [o for o in overrides if not o.startswith("ref_checkpointer.")]


@pytest.mark.parametrize(
    "family, relative, recipe", assets.ORPO_CONFIGS, ids=[relative for _, relative, _ in assets.ORPO_CONFIGS]
)
def test_shipped_orpo_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family, relative, recipe):  # noqa: F811
    data = family_assets(family)
    config = _copy_config(relative, tmp_path)
    lora = _lora_node(config) if "lora" in recipe else None
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter") if lora else None

    def run(out, *extra):
        overrides = [*_overrides(family, relative, recipe, data, out, adapter, config), *extra]
        if recipe == "lora_dpo_single_device":
            run_recipe(recipe, config, overrides, cwd=tmp_path, timeout=300)
        else:
            run_distributed(recipe, config, overrides, cwd=tmp_path)

    out = tmp_path / "run"
    run(out)
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, NUM_STEPS + 1))
    for record in records:  # ORPO's metrics, finite
        assert all(math.isfinite(record[k]) for k in ("loss", "nll_loss", "log_odds_ratio", "rewards/margins"))
        assert record["nll_loss"] > 0
    final = out / f"step_{NUM_STEPS}"
    trained = _load_strict(final)
    if lora is not None:
        _check_peft(family, "lora", data, final, lora)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    run(resumed_out, "resume_from_checkpoint=True")
    _check_resumed(resumed_out, _losses(out), trained)
