"""Memory probe. :func:`write` makes a random fp32 checkpoint in shards of up to 100 MB; run as a script,
`load DIR` loads it through FullModelTorchTuneCheckpointer in a fresh process, reads every byte, and prints the
size and the peak-RSS increase in MiB."""

import sys
from pathlib import Path

import torch


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> float:
    # getrusage's ru_maxrss survives exec (it reports the parent's peak when that was higher), so use the
    # process's own high-water mark, VmHWM, reset to the current RSS by writing 5 to clear_refs (Linux >= 4.0).
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def write(directory: Path, megabytes: int) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    shard_mb, remaining, index = 100, megabytes, 0
    while remaining > 0:
        size = min(shard_mb, remaining)
        tensors = {f"shard{index}.t{i}": torch.randn(size * 2**18 // 4) for i in range(4)}  # 4 tensors of size/4 MiB
        save_file(tensors, directory / f"model-{index:05d}.safetensors")
        remaining, index = remaining - size, index + 1


def load(directory: Path) -> None:
    from tune.training.checkpointing import FullModelTorchTuneCheckpointer

    ckpt = FullModelTorchTuneCheckpointer(directory, output_dir=directory.parent / "out")
    size = sum(p.stat().st_size for p in directory.glob("*.safetensors")) / 2**20
    before = _reset_peak()
    state = ckpt.load_checkpoint()["model"]
    total = sum(float(t.sum()) for t in state.values())  # touch every byte
    peak = _status_mib("VmHWM") - before
    print(f"size_mib={size:.1f} peak_rss_increase_mib={peak:.1f} checksum={total:.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(Path(sys.argv[2]))
