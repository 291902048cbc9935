"""Padding-free batches of preference pairs (tune.data.padding_free_collate_dpo) through the preference recipes: every
step's loss and metrics equal those of the same run with padded batches (tune.data.padded_collate_dpo).

The two layouts compute the same per-sequence values (tests/tune/rlhf/test_packed_sequence_log_probs.py, on a float64
decoder); in the recipes' float32 they differ by rounding only, so every logged value agrees within 1e-5 (relative
for values above 1, such as a grad norm of 34). The padded runs are themselves compared with TRL in
tests/recipes/test_reward_model_single_device.py, test_lora_dpo_single_device.py and test_orpo.py, which run with the
CPU default (padding-free)."""

from pathlib import Path

import pytest

from tests.recipes.dist_utils import run_concurrently, run_distributed, train_log
from tests.recipes.test_lora_dpo_single_device import _overrides as _dpo_overrides
from tests.recipes.test_lora_dpo_single_device import pairs  # noqa: F401 - a fixture
from tests.recipes.test_reward_model_single_device import _records as _reward_records
from tests.recipes.test_reward_model_single_device import _write_checkpoint, _write_config
from tests.recipes.utils import ASSETS, run_recipe

pytestmark = pytest.mark.integration

PADDED, PADDING_FREE = "tune.data.padded_collate_dpo", "tune.data.padding_free_collate_dpo"
TOLERANCE = 1e-5
# logged values that are not the training's (timings, memory, the throughput the layouts differ in)
_NOT_COMPARED = {"step", "lr", "tokens_per_second", "tokens_per_second_per_gpu", "time", "peak_memory_active"}


def _assert_same_steps(padded: dict[int, dict], padding_free: dict[int, dict], label: str) -> None:
    assert padded.keys() == padding_free.keys() and padded, label
    worst = 0.0
    for step, record in padded.items():
        other = padding_free[step]
        keys = {k for k, v in record.items() if isinstance(v, (int, float)) and k not in _NOT_COMPARED}
        keys = {k for k in keys if not k.startswith(("memory", "peak_", "tokens_per"))}
        assert keys <= other.keys(), (label, step, keys - other.keys())
        for key in keys:
            worst = max(worst, abs(record[key] - other[key]))
            expected = pytest.approx(record[key], abs=TOLERANCE, rel=TOLERANCE)
            assert other[key] == expected, (label, step, key, record, other)
    print(f"{label}: max |padding-free - padded| over {len(padded)} steps: {worst:.1e}")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_reward_model_padding_free_equals_padded(tmp_path, lora):
    """reward_model_single_device: 4 steps of 2 pairs of unequal lengths with margins and reward centering."""
    family = "llama3_2"
    checkpoint = _write_checkpoint(family, tmp_path / "hf", classifier=True)
    runs = {}
    for collate in (PADDED, PADDING_FREE, None):
        out = tmp_path / f"run_{collate}"
        config = _write_config(tmp_path, family, checkpoint, out, lora=lora, collate_fn=collate)
        proc = run_recipe("reward_model_single_device", config, [], cwd=tmp_path)
        runs[collate] = (_reward_records(out), proc.stdout + proc.stderr)
    records = {collate: {r["step"]: r for r in recs} for collate, (recs, _) in runs.items()}
    _assert_same_steps(records[PADDED], records[PADDING_FREE], f"reward model ({'LoRA' if lora else 'full'})")
    # the CPU default is the padding-free collate: the same losses, bit for bit
    assert [r["loss"] for r in records[None].values()] == [r["loss"] for r in records[PADDING_FREE].values()]
    assert f"collate_fn: null -> {PADDING_FREE} on cpu" in runs[None][1]


@pytest.mark.parametrize(
    "loss",
    [
        "loss._component_=tune.rlhf.loss.DPOLoss",
        "loss._component_=tune.rlhf.loss.ORPOLoss",
    ],
    ids=["dpo", "orpo"],
)
def test_lora_dpo_padding_free_equals_padded(tiny_assets, pairs, tmp_path, loss):  # noqa: F811 - the fixture
    """lora_dpo_single_device: 3 steps of 2 pairs, validated on 2 batches at step 2; DPO also with the reference's
    log-probs precomputed from padding-free batches."""
    extra = [loss, "max_steps_per_epoch=3", "run_val_every_n_steps=2", "max_validation_steps=2"]
    extra.append(f"dataset_val={{_component_: dpo_components.token_pairs, path: {pairs['pairs_file']}}}")
    if "DPOLoss" in loss:
        extra.append("precompute_ref_log_probs=True")
    records, output = {}, ""
    for collate in (PADDED, PADDING_FREE, None):
        out = tmp_path / str(collate).rsplit(".", 1)[-1]
        overrides = _dpo_overrides(tiny_assets, out, pairs["adapter"], f"collate_fn={collate or 'null'}", *extra)
        output = run_recipe("lora_dpo_single_device", pairs["config"], overrides, cwd=tmp_path).stderr
        records[collate] = train_log(out)  # training and validation records, by step
    assert "val_loss" in records[PADDED][2] and "val_loss" in records[PADDING_FREE][2]
    _assert_same_steps(records[PADDED], records[PADDING_FREE], f"LoRA {loss.rsplit('.', 1)[-1]}")
    # the CPU default is the padding-free collate
    assert f"collate_fn: null -> {PADDING_FREE} on cpu" in output
    assert [r["loss"] for r in records[None].values()] == [r["loss"] for r in records[PADDING_FREE].values()]


def test_full_dpo_distributed_padding_free_equals_padded_and_refused_under_context_parallelism(tiny_assets, tmp_path):
    """full_dpo_distributed on 2 gloo ranks, 2 steps of 2 pairs per rank; context parallelism refuses padding-free
    rows at collate_fn."""
    from tests.recipes._preference_assets import write_preference_messages

    data = write_preference_messages(tmp_path / "pairs.json", 8, seed=0)
    config = ASSETS / "full_dpo_tiny.yaml"

    def overrides(out: Path, collate: str, *extra: str) -> list[str]:
        common = [f"assets_dir={tiny_assets}", f"output_dir={out}", f"dataset.data_files={data}", "batch_size=2"]
        return [*common, "max_steps_per_epoch=2", f"collate_fn={collate}", *extra]

    padded, padding_free = tmp_path / "padded", tmp_path / "padding_free"
    _, _, refused = run_concurrently(
        lambda: run_distributed("full_dpo_distributed", config, overrides(padded, PADDED), tmp_path),
        lambda: run_distributed("full_dpo_distributed", config, overrides(padding_free, PADDING_FREE), tmp_path),
        lambda: run_distributed(
            "full_dpo_distributed",
            config,
            overrides(tmp_path / "cp", PADDING_FREE, "context_parallel_dim=2"),
            tmp_path,
            check=False,
        ),
    )
    _assert_same_steps(train_log(padded), train_log(padding_free), "full DPO, 2 ranks")
    assert refused.returncode != 0
    assert "context parallelism cuts padded rows; use tune.data.padded_collate_dpo" in refused.stdout + refused.stderr
