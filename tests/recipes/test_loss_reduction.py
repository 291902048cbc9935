"""A loss's declared reduction is honoured by the recipes: a torchtune-style mean loss trains like tune's sum.

``mean_loss.TorchtuneMeanLoss`` (tests/recipes/assets/mean_loss.py) returns the mean over scored tokens and declares
nothing, as a loss written for torchtune does; tune's built-in ``LinearCrossEntropyLoss`` is asked for the sum. The
recipe normalises either by the step's token count, so both runs log the same losses and end with the same weights:
torchtune's values, where the recipe multiplies the mean by the token count.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes.utils import ASSETS, loss_records, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "full_finetune_single_device"
CONFIG = ASSETS / "full_tiny.yaml"


def _run(assets: Path, out: Path, cwd: Path, *extra: str):
    # two optimizer steps of two micro-batches each: the micro-batches have different token counts, so a mean
    # rescaled by the step's count instead of its own micro-batch's would differ
    overrides = [
        f"assets_dir={assets}",
        f"output_dir={out}",
        "max_steps_per_epoch=2",
        "gradient_accumulation_steps=2",
        # plain SGD: the update is the gradient itself (x lr), so equal weights mean equal gradients. AdamW divides
        # by the gradient's running scale, which turns rounding noise in near-zero gradients into lr-sized steps
        "optimizer._component_=torch.optim.SGD",
        "optimizer.lr=0.5",
        *extra,
    ]
    return run_recipe(RECIPE, CONFIG, overrides, cwd=cwd)


def test_a_torchtune_mean_loss_logs_and_trains_like_the_built_in_sum(tiny_assets, tmp_path):
    built_in, custom = tmp_path / "built_in", tmp_path / "custom"
    _run(tiny_assets, built_in, tmp_path)
    proc = _run(
        tiny_assets, custom, tmp_path, "loss._component_=mean_loss.TorchtuneMeanLoss", "~loss.num_output_chunks"
    )

    expected, records = loss_records(built_in), loss_records(custom)
    print("built-in", [r["loss"] for r in expected], "\ncustom  ", [r["loss"] for r in records])
    assert [r["step"] for r in records] == [1, 2]
    # a token mean of an untrained model (6.02 here, ln 320 = 5.8); before the fix the recipe divided the mean by
    # the step's ~78 tokens again and logged 0.077
    assert records[0]["loss"] > 1.0
    for record, reference in zip(records, expected):
        assert record["loss"] == pytest.approx(reference["loss"], abs=1e-6, rel=0)
        assert record["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    weights, reference_weights = (
        load_file(custom / "step_2" / "model.safetensors"),
        load_file(built_in / "step_2" / "model.safetensors"),
    )
    assert weights.keys() == reference_weights.keys()
    initial = load_file(tiny_assets / "llama" / "model.safetensors")
    assert max((weights[name] - initial[name]).abs().max().item() for name in weights) > 1e-2  # real updates
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference_weights[name], atol=1e-6, rtol=0, msg=name)
    # said once, with the class and how to declare a sum
    assert (proc.stdout + proc.stderr).count("mean_loss.TorchtuneMeanLoss declares no `reduction`") == 1
