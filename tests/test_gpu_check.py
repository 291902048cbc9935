"""benchmarks/gpu_check.py in its dry mode (CPU, tiny shapes, fp32, tune only): the GPU check cannot rot.

The GPU run itself (``make gpu-check``) writes the same table with real shapes; here every section must produce its
rows, every recipe run must finish and log its steps, and the table must say what each row measured.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def _dry_run(out, *sections: str) -> tuple[dict, str]:
    command = [sys.executable, "benchmarks/gpu_check.py", "--dry", "--out", str(out), "--sections", ",".join(sections)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), (out / "table.md").read_text()


# the sections in two tests, which the suite's workers run side by side; `make gpu-check` runs all three in one
def test_gpu_check_dry_run_checks_the_tier_and_measures_every_speed_row(tmp_path):
    results, table = _dry_run(tmp_path / "out", "correctness", "speed")
    assert results["correctness"]["status"] == 0, results["correctness"]
    assert [c["passed"] for c in results["comparisons"]] == [True]  # the dry run's one comparison, recorded
    speed = {r["label"]: r for r in results["speed"]}
    assert sorted(speed) == ["8B full", "8B lora", "8B qlora"]
    for label, run in speed.items():
        assert run["status"] == 0 and [s["step"] for s in run["steps"]] == [1, 2, 3, 4], label
        assert run["tokens_per_s"] > 0, label
    for row in ("tiny lora, batch 2 x 2048 packed, compile", "tiny full", "tiny qlora", "pytest -m gpu"):
        assert row in table, row


def test_gpu_check_dry_run_measures_sampling_dpo_and_grpo(tmp_path):
    results, table = _dry_run(tmp_path / "out", "rl")
    rl = {r["label"]: r for r in results["rl"]}
    assert rl["1B dpo"]["pairs_per_s"] > 0 and rl["1B grpo"]["completions_per_s"] > 0
    sampling = results["sampling"]  # benchmarks/bench_generate.py: 32 rows, each 16 new tokens (none stop early)
    assert sampling["batch"] == 32 and sampling["rows"][0]["new_tokens"] == 32 * 16
    for row in ("tiny LoRA DPO", "tiny full GRPO", "tiny sampling"):
        assert row in table, row


def test_runs_the_budget_leaves_out_are_listed_and_the_exit_status_says_so(tmp_path):
    command = [sys.executable, "benchmarks/gpu_check.py", "--dry", "--out", str(tmp_path / "out")]
    command += ["--sections", "speed", "--modes", "lora", "--budget-s", "1"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| tune | not run: time budget |" in (tmp_path / "out" / "table.md").read_text()
