"""Every GRPO recipe samples by one rule (tune.rlhf.completion_generators): a generator per completion, seeded by the
run's seed, the epoch, the prompt's dataset index and the completion's number. So grpo_full_finetune_single_device
with 2 prompts per step, grpo_full_finetune_distributed on 1 gloo rank with 2 prompts and on 2 ranks with 1 prompt
each sample the same completions and log the same losses, and a single-device run resumed mid-epoch samples what
the uninterrupted run sampled.

The completions are read back from a reward that writes what it scores (``SampleLog`` below, weight 0), one file
per rank. The runs take 2 epochs of 2 steps, so the seeds of epoch 1 are exercised too; forward_batch_size 3 with
4 completions per prompt splits the single-device and 1-rank batches (8 rows) and the 2-rank ones (4 rows)
differently into micro-batches.
"""

import json
import shutil
from pathlib import Path

import pytest

from tests.recipes.dist_utils import run_concurrently, run_distributed, train_log
from tests.recipes.test_grpo_full_finetune_single_device import write_sum_prompts
from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

SAMPLE_LOG = '''
import json
import os


class SampleLog:
    """A reward of 0 that appends the prompts and completions of each call to <directory>/rank<RANK>.jsonl."""

    name = "sample_log"

    def __init__(self, directory):
        self.path = os.path.join(directory, "rank" + os.environ.get("RANK", "0") + ".jsonl")

    def __call__(self, prompts, completions, **fields):
        with open(self.path, "a") as f:
            f.write(json.dumps({"prompts": prompts, "completions": completions}) + "\\n")
        return [0.0] * len(completions)
'''
GROUP = 4  # grpo_samples of grpo_tiny.yaml and grpo_tiny_distributed.yaml
# loss and grad-norm differences allowed between the layouts (float32 sums over differently split batches)
TOLERANCE = 1e-5


def _overrides(assets: Path, prompts: Path, out: Path, samples: Path, *extra: str) -> list[str]:
    samples.mkdir(parents=True, exist_ok=True)
    rewards = [
        {"_component_": "tune.rlhf.AnswerReward"},
        "grpo_components.digit_share",
        {"_component_": "sample_log.SampleLog", "directory": str(samples)},
    ]
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"dataset.data_files={prompts}",
        f"reward_functions={json.dumps(rewards)}",
        "reward_weights=[1.0, 0.5, 0.0]",
        "epochs=2",
        "max_steps_per_epoch=2",
        *extra,
    ]


def _samples(directory: Path) -> list[list[tuple[str, tuple[str, ...]]]]:
    """Per step, the prompts' groups of completions of every rank, sorted: ``[(prompt, (completion, ...)), ...]``."""
    per_rank = [read_jsonl(path) for path in sorted(directory.glob("rank*.jsonl"))]
    assert per_rank and len({len(calls) for calls in per_rank}) == 1, [len(calls) for calls in per_rank]
    steps = []
    for calls in zip(*per_rank):  # one call per step on each rank
        groups = []
        for call in calls:
            for start in range(0, len(call["completions"]), GROUP):
                groups.append((call["prompts"][start], tuple(call["completions"][start : start + GROUP])))
        steps.append(sorted(groups))
    return steps


def test_single_device_one_and_two_ranks_sample_alike_and_resume_samples_the_same(tiny_assets, tmp_path):
    prompts = write_sum_prompts(tmp_path / "prompts.json")
    (tmp_path / "sample_log.py").write_text(SAMPLE_LOG)  # the working directory is importable
    runs = {name: (tmp_path / name, tmp_path / f"{name}_samples") for name in ("single", "one_rank", "two_ranks")}

    def run(name: str, *extra: str) -> None:
        out, samples = runs[name]
        overrides = _overrides(tiny_assets, prompts, out, samples, *extra)
        if name == "single":
            run_recipe("grpo_full_finetune_single_device", ASSETS / "grpo_tiny.yaml", overrides, cwd=tmp_path)
        else:
            nproc = 1 if name == "one_rank" else 2
            config = ASSETS / "grpo_tiny_distributed.yaml"
            run_distributed("grpo_full_finetune_distributed", config, overrides, cwd=tmp_path, nproc=nproc)

    run_concurrently(
        lambda: run("single", "batch_size=2", "save_every_n_steps=1"),
        lambda: run("one_rank", "batch_size=2"),
        lambda: run("two_ranks", "batch_size=1"),
    )
    samples = {name: _samples(directory) for name, (_, directory) in runs.items()}
    logs = {name: train_log(out) for name, (out, _) in runs.items()}
    assert len(samples["single"]) == 4 and all(len(groups) == 2 for groups in samples["single"])
    assert len({c for groups in samples["single"] for _, group in groups for c in group}) > 4  # it did sample
    for name in ("one_rank", "two_ranks"):
        assert samples[name] == samples["single"], name
    for key in ("loss", "grad_norm", "reward", "completions/mean_length"):
        values = {name: [logs[name][step][key] for step in (1, 2, 3, 4)] for name in runs}
        print(key, values)
        for name in ("one_rank", "two_ranks"):
            assert max(abs(a - b) for a, b in zip(values[name], values["single"])) < TOLERANCE, (key, values)
    assert logs["single"][3]["loss"] != logs["single"][1]["loss"]  # later steps follow real updates

    out, directory = runs["single"]
    for name in ("step_2", "step_3", "step_4", "logs"):  # "crash" after step 1, in the middle of epoch 0
        shutil.rmtree(out / name)
    shutil.rmtree(directory)
    run("single", "batch_size=2", "save_every_n_steps=1", "resume_from_checkpoint=True")
    assert _samples(directory) == samples["single"][1:]  # what the uninterrupted run sampled, in both epochs
    resumed = train_log(out)
    assert sorted(resumed) == [2, 3, 4]
    for step in (2, 3, 4):
        assert resumed[step]["loss"] == pytest.approx(logs["single"][step]["loss"], abs=1e-6)
