"""Helpers of the distributed recipe tests: `tune run --nproc_per_node N` (torchrun) on CPU with gloo."""

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from tests.recipes.utils import ASSETS, ROOT, pad_batch, read_jsonl, tiny_dataset

VAL = [  # the validation split of the tiny assets, evaluated every 5 steps
    "dataset_val._component_=tune.datasets.alpaca_dataset",
    "dataset_val.source=json",
    "dataset_val.data_files=${assets_dir}/val.json",
    "dataset_val.split=train",
    "dataset_val.train_on_input=False",
    "run_val_every_n_steps=5",
]


def run_distributed(
    recipe: str, config: Path, overrides: list[str], cwd: Path, nproc: int = 2, check: bool = True
) -> subprocess.CompletedProcess:
    """Runs ``tune run --standalone --nproc_per_node NPROC RECIPE --config CONFIG OVERRIDES`` in a subprocess.

    ``--standalone`` lets torchrun pick a free rendezvous port, so tests running side by side do not collide.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ASSETS), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "tune._cli.main",
        "run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        recipe,
        "--config",
        str(config),
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 or not check, (
        f"`{' '.join(cmd)}` exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}"
    )
    return proc


def train_log(out: Path) -> dict[int, dict]:
    """Step -> the metrics logged at that step (training and validation records merged)."""
    steps: dict[int, dict] = {}
    for record in read_jsonl(out / "logs" / "log.jsonl"):
        steps.setdefault(record["step"], {}).update(record)
    return steps


def max_difference(a: dict[int, dict], b: dict[int, dict], key: str) -> float:
    """The largest |a - b| of a metric over the steps both logged (asserting they logged the same steps)."""
    steps = sorted(s for s in a if key in a[s])
    assert steps and steps == sorted(s for s in b if key in b[s]), (key, sorted(a), sorted(b))
    return max(abs(a[s][key] - b[s][key]) for s in steps)


def validation_logits(model: torch.nn.Module, assets: Path) -> torch.Tensor:
    """Logits of a transformers model on the first 4 validation samples [4, s, vocab]."""
    dataset = tiny_dataset(assets, "val.json")
    tokens, _ = pad_batch([dataset[i] for i in range(4)])
    with torch.no_grad():
        return model.eval()(input_ids=tokens).logits


def run_concurrently(*runs: Callable[[], Any]) -> list[Any]:
    """Calls each function (a recipe run, say ``lambda: run_recipe(...)``) in its own thread and returns their
    results in order: a single-device reference and a distributed run start together instead of one after the
    other (the subprocesses do the work; the threads only wait for them)."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return [future.result() for future in [pool.submit(run) for run in runs]]
