import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tune.training.checkpointing._memory_probe import write

REPO = Path(__file__).resolve().parents[4]
PROBE = Path(__file__).with_name("_memory_probe.py")


def _measure(tmp_path, megabytes):
    directory = tmp_path / "model"
    write(directory, megabytes)  # here, 100 MB at a time; the measurement runs in a fresh process
    result = subprocess.run(
        [sys.executable, str(PROBE), "load", str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    size, peak = map(float, re.search(r"size_mib=([\d.]+) peak_rss_increase_mib=([\d.]+)", result.stdout).groups())
    print(f"loaded {size:.0f} MiB: peak RSS grew by {peak:.0f} MiB ({peak / size:.2f}x)")
    return size, peak


def test_loading_200mb_peaks_well_under_twice_its_size(tmp_path):
    size, peak = _measure(tmp_path, 200)
    assert size == pytest.approx(200, rel=0.01)
    # Tensors are memory-mapped (read once, no second copy); the bound leaves room for allocator noise. The
    # lower bound checks the measurement itself: every byte was read, so the mapped pages count in the RSS.
    assert 0.5 * size < peak < 1.3 * size


@pytest.mark.slow
def test_loading_1gb_peaks_well_under_twice_its_size(tmp_path):
    size, peak = _measure(tmp_path, 1024)
    assert 0.5 * size < peak < 1.3 * size
