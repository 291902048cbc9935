"""Each shipped KTO config (tests/recipes/_family_assets.py KTO_CONFIGS) end to end on its family's tiny model: the
config as shipped (accumulation, schedule, optimizer, shuffling), on the generated preference pairs read as unpaired
examples (``tune.datasets.unpaired_from_pairs``), 4 steps of 1 example per micro-batch; the outputs load in
transformers (and PEFT for LoRA), and a run resumed after step 2 ends with the uninterrupted run's losses and
weights. kto_distributed's configs run on 2 gloo ranks (1 example per rank and micro-batch)."""

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import run_distributed
from tests.recipes.test_every_family import (
    NUM_STEPS,
    _check_peft,
    _check_resumed,
    _copy_config,
    _crashed_copy,
    _initial_adapter,
    _load_strict,
    _lora_node,
    _losses,
    _overrides,
    family_assets,  # noqa: F401 - a fixture
)
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECIPE, DIST_RECIPE = "kto_single_device", "kto_distributed"
CASES = [(family, relative, method) for family, cases in assets.KTO_CONFIGS.items() for relative, method in cases]


def _kto_overrides(family: str, method: str, data, out, adapter, distributed: bool = False) -> list[str]:
    overrides = [
        o for o in _overrides(family, method, data, out, adapter) if not o.startswith(("dataset.", "batch_size="))
    ]
    return [
        *overrides,
        "batch_size=1",
        "dataset._component_=tune.datasets.unpaired_from_pairs",
        "dataset.source=json",
        f"dataset.data_files={data / 'pairs.json'}",
        "dataset.split=train",
        "dataset.kl_group_size=4",  # 2 pairs per group: chosen, chosen, rejected, rejected
        # kto_distributed, full: the frozen reference is the same tiny checkpoint
        *([f"ref_checkpointer.checkpoint_dir={data / 'hf'}"] if method == "full" and distributed else []),
    ]


@pytest.mark.parametrize("family, relative, method", CASES, ids=[relative for _, relative, _ in CASES])
def test_shipped_kto_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family, relative, method):  # noqa: F811
    data = family_assets(family)
    config = _copy_config(relative, tmp_path)
    lora = _lora_node(config) if method == "lora" else None
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter") if lora else None
    distributed = not relative.endswith("_single_device.yaml")

    def run(out, *extra):
        overrides = [*_kto_overrides(family, method, data, out, adapter, distributed), *extra]
        if distributed:
            run_distributed(DIST_RECIPE, config, overrides, cwd=tmp_path)
        else:
            run_recipe(RECIPE, config, overrides, cwd=tmp_path, timeout=300)

    out = tmp_path / "run"
    run(out)
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, NUM_STEPS + 1))
    for record in records:
        # a shuffled step of 4 examples may hold one kind only: its metrics of the other kind are left out
        keys = ["loss", "kl", *(k for k in ("logps/chosen", "logps/rejected") if k in record)]
        assert len(keys) > 2 and all(torch.isfinite(torch.tensor(record[k])) for k in keys)
    trained = _load_strict(out / f"step_{NUM_STEPS}")
    if lora:
        _check_peft(family, method, data, out / f"step_{NUM_STEPS}", lora)
    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    run(resumed_out, "resume_from_checkpoint=True")
    _check_resumed(resumed_out, _losses(out), trained)
