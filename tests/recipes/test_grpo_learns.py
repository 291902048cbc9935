"""GRPO learns (slow tier): `make demo-rl` as it runs (demo/run_demo_rl.sh) on the demo's generated list tasks.

A short supervised fine-tuning (120 steps) leaves the demo model right on about a third of the held-out counting
prompts ("How many items are in the list?"); 30 GRPO steps on that task with the exact-match reward
(configs/demo/grpo_single_device.yaml) must raise its held-out exact match on it (greedy decoding, demo/evaluate.py).
Measured on 2 busy CPU cores: counting 36.2% -> 78.7%, all tasks 21.0% -> 29.0%. A recipe whose loss does not push
towards the rewarded completions leaves it where it was.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.test_demo import _accuracy
from tests.recipes.utils import ROOT

pytestmark = pytest.mark.integration


def _task_accuracy(report: str, label: str, task: str = "How many items are in the list?") -> float:
    """The counting task's line of demo/evaluate.py's report under ``[label]``."""
    section = report.split(f"[{label}] held-out exact match:", 1)[1]
    line = next(line for line in section.splitlines() if line.strip().startswith(task))
    return float(line.rsplit(" ", 1)[1].rstrip("%")) / 100


@pytest.mark.slow
def test_grpo_raises_the_exact_match_of_an_sft_model(tmp_path):
    env = {**os.environ, "TQDM_DISABLE": "1", "DEMO_OUT": str(tmp_path / "demo_rl_out")}
    proc = subprocess.run(
        ["bash", str(ROOT / "demo" / "run_demo_rl.sh"), str(Path(sys.executable).parent)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before, after = _task_accuracy(proc.stdout, "before"), _task_accuracy(proc.stdout, "after")
    print(f"held-out exact match on the counting task: {before:.1%} before GRPO, {after:.1%} after")
    print(f"all tasks: {_accuracy(proc.stdout, 'before'):.1%} before, {_accuracy(proc.stdout, 'after'):.1%} after")
    assert after >= before + 0.2
