"""Integration tests of recipes/knowledge_distillation_distributed.py: `tune run --nproc_per_node 2` (torchrun) on
CPU with gloo, on the tiny Llamas of tests/recipes/test_knowledge_distillation_single_device.py (a LoRA student and a
larger teacher: 3 layers, wider MLP, same vocabulary; tests/recipes/assets/kd_tiny.yaml).

The reference is knowledge_distillation_single_device (itself checked against a plain PyTorch loop over Hugging
Face models) on the same config and global batch: 2 ranks x 2 samples (or x 1 sample x 2 accumulation steps) see
the same 4 samples per step as 1 device x 4 samples, and the losses are normalised by the loss tokens of the whole
step on all ranks. Both start from one PEFT adapter with random A and B (``adapter_checkpoint``).
"""

import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log, validation_logits
from tests.recipes.test_knowledge_distillation_single_device import _save_hf_llama
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

RECIPE, SINGLE = "knowledge_distillation_distributed", "knowledge_distillation_single_device"
CONFIG = ASSETS / "kd_tiny.yaml"
LOSSES = ["loss", "class_loss", "kd_loss"]


@pytest.fixture(scope="module")
def start(tiny_assets, tmp_path_factory):
    """The teacher (its HF checkpoint) and the student's starting adapter, written once."""
    root = tmp_path_factory.mktemp("kd_distributed")
    return {
        "teacher": _save_hf_llama(root / "teacher", num_layers=3, intermediate_size=384, seed=1),
        "adapter": random_peft_adapter(tiny_assets, root / "start_adapter"),
    }


def _overrides(assets: Path, start: dict, out: Path, *extra: str) -> list[str]:
    return [
        f"assets_dir={assets}",
        f"teacher_dir={start['teacher']}",
        f"output_dir={out}",
        f"checkpointer.adapter_checkpoint={start['adapter']}",
        "shuffle=True",
        *extra,
    ]


def _compare(reference: dict, distributed: dict, keys: list[str], label: str) -> float:
    worst = {key: max_difference(reference, distributed, key) for key in keys}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


def test_two_ranks_match_one_device(tiny_assets, start, tmp_path):
    """2 steps: the mixed loss and its two parts equal the single-device run's."""
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    steps = "max_steps_per_epoch=2"
    run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", steps), tmp_path),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, "batch_size=2", steps), tmp_path),
    )
    reference, distributed = train_log(single), train_log(two)
    assert sorted(distributed) == [1, 2]
    assert _compare(reference, distributed, LOSSES, "KD") < 1e-5
    assert max_difference(reference, distributed, "grad_norm") < 1e-5 * reference[1]["grad_norm"]
    assert min(r["kd_loss"] for r in distributed.values()) > 0.1  # the teacher differs: a non-trivial KD term


@pytest.mark.slow
def test_accumulation_validation_resume_and_outputs(tiny_assets, start, tmp_path):
    """4 steps of 2 ranks x 1 sample x 2 accumulation steps equal 1 device x 4 samples, validation included;
    resuming from step 2 reproduces steps 3 and 4; the outputs load in transformers and PEFT."""
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    validation = [
        "dataset_val._component_=tune.datasets.alpaca_dataset",
        "dataset_val.source=json",
        "dataset_val.data_files=${assets_dir}/val.json",
        "dataset_val.split=train",
        "dataset_val.train_on_input=False",
        "run_val_every_n_steps=2",
    ]
    common = ["max_steps_per_epoch=4", *validation]
    accumulate = ["batch_size=1", "gradient_accumulation_steps=2", "save_every_n_steps=2", *common]
    run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", *common), tmp_path),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, *accumulate), tmp_path),
    )
    reference, distributed = train_log(single), train_log(two)
    assert _compare(reference, distributed, [*LOSSES, "val_loss"], "KD, accumulation") < 1e-5

    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    for path in [resumed / "step_4", resumed / "logs"]:
        shutil.rmtree(path)
    overrides = _overrides(tiny_assets, start, resumed, *accumulate, "resume_from_checkpoint=True")
    run_distributed(RECIPE, CONFIG, overrides, tmp_path)
    after = train_log(resumed)
    assert sorted(after) == [3, 4]
    worst = max(abs(after[s][k] - distributed[s][k]) for s in after for k in LOSSES)
    print(f"KD resumed at step 2: max |resumed - uninterrupted| over steps 3-4 = {worst:.1e}")
    assert worst <= 1e-6

    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = two / "step_4"
    merged = validation_logits(LlamaForCausalLM.from_pretrained(final, dtype=torch.float32), tiny_assets)
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    with_adapter = validation_logits(PeftModel.from_pretrained(base, final / "adapter"), tiny_assets)
    torch.testing.assert_close(with_adapter, merged, atol=1e-5, rtol=0)  # the adapter is the merged update
    one_device = LlamaForCausalLM.from_pretrained(single / "step_4", dtype=torch.float32)
    torch.testing.assert_close(merged, validation_logits(one_device, tiny_assets), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_teacher_with_another_vocabulary_is_a_config_error(tiny_assets, start, tmp_path):
    teacher = _save_hf_llama(tmp_path / "teacher", num_layers=2, intermediate_size=256, seed=2, vocab_size=384)
    extra = ["teacher_model.num_layers=2", "teacher_model.intermediate_dim=256", "teacher_model.vocab_size=384"]
    overrides = [*_overrides(tiny_assets, start, tmp_path / "run", *extra), f"teacher_dir={teacher}"]
    proc = run_distributed(RECIPE, CONFIG, overrides, tmp_path, check=False)
    assert proc.returncode != 0
    assert "vocabulary of 384 tokens" in proc.stderr and "(model) has 320" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr
