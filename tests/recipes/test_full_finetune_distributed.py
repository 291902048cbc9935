"""Integration tests of recipes/full_finetune_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with
gloo, on the tiny Llama of tests/recipes/utils.py.

The reference is the single-device recipe on the same global batch: 2 ranks x batch 2 (or x batch 1 x 2
accumulation steps) see the same 4 samples per step as 1 device x batch 4 (the distributed sampler deals the
same shuffled order round-robin), so the losses must agree to float32 rounding (1e-4 asked; ~1e-6 measured).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests._helpers import assert_close_after_adamw
from tests.recipes.dist_utils import VAL, max_difference, run_distributed, train_log, validation_logits
from tests.recipes.utils import ASSETS, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "full_finetune_distributed"
CONFIG = ASSETS / "full_tiny.yaml"
STEPS = 5
COMMON = [f"max_steps_per_epoch={STEPS}", "shuffle=True"]


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", *COMMON, *extra]


def test_two_ranks_match_one_device_with_and_without_accumulation(tiny_assets, tmp_path):
    single, two, accumulated = tmp_path / "single", tmp_path / "two_ranks", tmp_path / "accumulated"
    run_recipe(
        "full_finetune_single_device", CONFIG, _overrides(tiny_assets, single, "batch_size=4", *VAL), cwd=tmp_path
    )
    # activation checkpointing on, and saves every 2 steps: neither may change the numbers
    run_distributed(
        RECIPE,
        CONFIG,
        _overrides(
            tiny_assets, two, "batch_size=2", "save_every_n_steps=2", "enable_activation_checkpointing=True", *VAL
        ),
        cwd=tmp_path,
    )
    run_distributed(
        RECIPE,
        CONFIG,
        _overrides(tiny_assets, accumulated, "batch_size=1", "gradient_accumulation_steps=2"),
        cwd=tmp_path,
    )
    ref, got, got_accumulated = train_log(single), train_log(two), train_log(accumulated)

    assert sorted(got) == sorted(got_accumulated) == list(range(1, STEPS + 1))
    loss_diff, accumulated_diff = max_difference(ref, got, "loss"), max_difference(ref, got_accumulated, "loss")
    print(f"max |loss(2 ranks) - loss(1 device)| = {loss_diff:.2e}; with accumulation 2: {accumulated_diff:.2e}")
    assert loss_diff < 1e-4 and accumulated_diff < 1e-4
    assert max_difference(ref, got, "grad_norm") < 1e-4 * ref[1]["grad_norm"]  # full norm over both ranks' shards
    assert abs(got[STEPS]["val_loss"] - ref[STEPS]["val_loss"]) < 1e-4  # 5 validation samples on each rank
    for record in got.values():
        assert record["tokens_per_second"] > 0 and record["tokens_per_second_per_gpu"] > 0

    # outputs: HF checkpoints gathered to rank 0 at steps 2, 4, 5; sharded resume state at 2 and 4 (not the last)
    assert sorted(p.name for p in two.glob("step_*")) == ["step_2", "step_4", "step_5"]
    assert sorted(p.name for p in (two / "dcp").glob("step_*")) == ["step_2", "step_4"]
    assert len(list((two / "dcp" / "step_2").glob("*.distcp"))) == 2  # one file of shards per rank
    from transformers import LlamaForCausalLM

    trained = LlamaForCausalLM.from_pretrained(two / f"step_{STEPS}", dtype=torch.float32)
    reference = LlamaForCausalLM.from_pretrained(single / f"step_{STEPS}", dtype=torch.float32)
    logits, ref_logits = validation_logits(trained, tiny_assets), validation_logits(reference, tiny_assets)
    print(f"max |logits(2 ranks) - logits(1 device)| after {STEPS} steps = {(logits - ref_logits).abs().max():.2e}")
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)


def test_tensor_parallel_two_ranks_match_one_rank(tiny_assets, tmp_path):
    one, tp = tmp_path / "tp1", tmp_path / "tp2"
    extra = ["batch_size=4", "clip_grad_norm=1.0"]  # clipping across the 2-D mesh's two kinds of shards
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, one, *extra), cwd=tmp_path)  # no torchrun: world size 1
    run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, tp, *extra, "tensor_parallel_dim=2"), cwd=tmp_path)
    ref, got = train_log(one), train_log(tp)
    loss_diff = max_difference(ref, got, "loss")
    print(f"max |loss(TP=2) - loss(TP=1)| = {loss_diff:.2e}")
    assert loss_diff < 1e-4
    assert max_difference(ref, got, "grad_norm") < 1e-4 * ref[1]["grad_norm"]
    # the gathered output holds whole matrices again (measured: 1 or 2 elements of 380k apart by 2e-5 to 1.1e-4,
    # depending on the data, the others by < 6e-6)
    from safetensors.torch import load_file

    one_weights, tp_weights = (load_file(d / f"step_{STEPS}" / "model.safetensors") for d in (one, tp))
    assert_close_after_adamw(tp_weights, one_weights, lr=1e-3, steps=STEPS)


@pytest.mark.slow  # the suite's time budget: resuming across two ranks runs in the default tier for LoRA
def test_finetuning_schedule_converters_and_resume_across_two_ranks(tiny_assets, tmp_path):
    out, record = tmp_path / "run", tmp_path / "converter.jsonl"
    # phase 0 trains the last layer, final norm and output; layer 0 and the embeddings join after step 2
    schedule = [
        "finetuning_schedule=[{params: ['layers.1.*', 'norm', 'output'], transition: {after_steps: 2}},"
        " {params: ['layers.0.*', 'tok_embeddings']}]"
    ]
    # seed: null and shuffling, as the shipped configs: the resumed run must take the seed the run drew
    common = _overrides(
        tiny_assets, out, "batch_size=2", "save_every_n_steps=2", "seed=null", "shuffle=True", *schedule
    )
    converter = f"model_converters=[{{_component_: dist_components.RecordingConverter, path: {record}}}]"
    run_distributed(RECIPE, CONFIG, [*common, converter], cwd=tmp_path)
    uninterrupted = train_log(out)
    # the converter saw the model as built (meta, before sharding), its hook the sharded model after each step
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [e["event"] for e in events] == ["convert"] + ["post_optimizer_hook"] * STEPS
    assert events[0]["all_meta"] and not events[0]["all_sharded"]
    assert all(e["all_sharded"] and not e["all_meta"] for e in events[1:])
    from safetensors.torch import load_file

    base = load_file(tiny_assets / "llama" / "model.safetensors")
    at_step_2, at_step_4 = (load_file(out / f"step_{n}" / "model.safetensors") for n in (2, 4))
    frozen = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(at_step_2[frozen], base[frozen]) and torch.equal(
        at_step_2["model.embed_tokens.weight"], base["model.embed_tokens.weight"]
    )
    assert not torch.equal(at_step_2["model.layers.1.mlp.up_proj.weight"], base["model.layers.1.mlp.up_proj.weight"])
    assert not torch.equal(at_step_4[frozen], base[frozen])  # phase 1 began after step 2

    # "crash" after step 2: keep only its checkpoints, resume into the same output_dir (schedule in phase 1)
    for path in [out / "step_4", out / "step_5", out / "dcp" / "step_4", out / "logs"]:
        shutil.rmtree(path)
    proc = run_distributed(RECIPE, CONFIG, [*common, "resume_from_checkpoint=True"], cwd=tmp_path)
    assert "resumed in phase 1 of 2" in proc.stderr
    assert "seed: null: resuming with the run's seed" in proc.stderr
    resumed = train_log(out)
    assert sorted(resumed) == [3, 4, 5]
    for step in resumed:  # same data order, optimizer state and param groups, LR schedule and RNG
        assert resumed[step]["loss"] == pytest.approx(uninterrupted[step]["loss"], abs=1e-6, rel=0), step


def test_non_finite_loss_stops_every_rank_without_a_traceback(tiny_assets, tmp_path):
    out = tmp_path / "run"
    extra = [
        "batch_size=2",
        "loss._component_=nan_loss.NaNAfterNCalls",
        "loss.num_finite_calls=2",
        "save_every_n_steps=1",
    ]
    proc = run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "The training loss is nan at step 3" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr
    assert sorted(p.name for p in out.glob("step_*")) == ["step_1", "step_2"]  # nothing after the last good step
    assert sorted(train_log(out)) == [1, 2]


@pytest.mark.parametrize(
    "extra, expected",
    [
        # without torchrun the recipe runs as a world of 1 process, which tensor_parallel_dim=2 cannot divide
        (["tensor_parallel_dim=2"], "tensor_parallel_dim=2 does not divide the world size 1"),
        (["dist_backend=nccl"], "backend='nccl' needs CUDA, which this machine does not have"),
    ],
)
def test_config_errors_are_reported_without_a_traceback(tiny_assets, tmp_path, extra, expected):
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "run", *extra), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_single_device_recipe_refuses_torchrun_flags(tiny_assets, tmp_path):
    proc = run_distributed(
        "full_finetune_single_device", CONFIG, _overrides(tiny_assets, tmp_path / "run"), cwd=tmp_path, check=False
    )
    assert proc.returncode == 1
    assert "does not support distributed runs" in proc.stderr and "full_finetune_distributed" in proc.stderr
