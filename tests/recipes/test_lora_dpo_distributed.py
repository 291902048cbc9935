"""Integration tests of recipes/lora_dpo_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with gloo,
on the tiny Llama of tests/recipes/utils.py and generated preference pairs (tests/recipes/_preference_assets.py).

The reference is lora_dpo_single_device (itself checked against TRL's DPOTrainer in
test_lora_dpo_single_device.py) on the same config and global batch: 2 ranks x 2 pairs (or x 1 pair x 2
accumulation steps) see the same 4 pairs per step as 1 device x 4 pairs. Both start from one PEFT adapter with
random A and B (``adapter_checkpoint``): the recipes draw fresh adapters differently (one device initialises the
whole model, the distributed recipe only the adapters), and a non-zero B makes the policy differ from the reference
(the model with adapters disabled) from step 1, so that every reward metric is compared on non-trivial values.
With ``precompute_ref_log_probs`` the reference's log-probs are a table computed over the ranks before training; the
run with it is compared with the run without it.
"""

import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

RECIPE, SINGLE = "lora_dpo_distributed", "lora_dpo_single_device"
CONFIG = ASSETS / "lora_dpo_tiny.yaml"  # LoRA rank 8, alpha 16 on q_proj, v_proj, output_proj and the MLP
METRICS = [
    "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip


@pytest.fixture(scope="module")
def start(tiny_assets, tmp_path_factory):
    """The preference pairs (32 training, 8 held out) and the starting adapter, written once."""
    root = tmp_path_factory.mktemp("lora_dpo_distributed")
    return {
        "pairs": write_preference_messages(root / "pairs.json", 32, seed=0),
        "held_out": write_preference_messages(root / "held_out.json", 8, seed=1),
        "adapter": random_peft_adapter(tiny_assets, root / "start_adapter"),
    }


def _overrides(assets: Path, start: dict, out: Path, *extra: str) -> list[str]:
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"dataset.data_files={start['pairs']}",
        f"checkpointer.adapter_checkpoint={start['adapter']}",
        "shuffle=True",
        *extra,
    ]


def _validation(start: dict) -> list[str]:
    node = "{_component_: tune.datasets.preference_dataset, source: json, split: train, data_files: %s}"
    node = node % start["held_out"]
    return [f"dataset_val={node}", "run_val_every_n_steps=2"]


def _compare(reference: dict, distributed: dict, keys: list[str], label: str) -> float:
    worst = {key: max_difference(reference, distributed, key) for key in keys}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


@pytest.fixture(scope="module")
def two_step_runs(tiny_assets, start, tmp_path_factory):
    """2 shuffled steps: 1 device x 4 pairs, and 2 ranks x 2 pairs with and without precompute_ref_log_probs, run
    side by side."""
    root = tmp_path_factory.mktemp("lora_dpo_two_steps")
    single, two, precomputed = root / "single", root / "two_ranks", root / "precomputed"
    steps = "max_steps_per_epoch=2"
    _, _, proc = run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", steps), root),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, "batch_size=2", steps), root),
        lambda: run_distributed(
            RECIPE,
            CONFIG,
            _overrides(tiny_assets, start, precomputed, "batch_size=2", steps, "precompute_ref_log_probs=True"),
            root,
        ),
    )
    return {
        "single": train_log(single),
        "two_ranks": train_log(two),
        "precomputed": train_log(precomputed),
        "precomputed_output": proc.stdout + proc.stderr,
    }


def test_two_ranks_match_one_device(two_step_runs):
    """2 steps: the loss and every preference metric (all-reduced over the ranks) equal the single-device run's."""
    reference, distributed = two_step_runs["single"], two_step_runs["two_ranks"]
    assert sorted(distributed) == [1, 2]
    assert _compare(reference, distributed, METRICS, "LoRA DPO") < 1e-5
    assert max_difference(reference, distributed, "grad_norm") < 1e-5 * reference[1]["grad_norm"]
    assert reference[1]["rewards/margins"] != 0  # the random adapter makes the policy differ from the reference


def test_precomputed_reference_log_probs_train_as_the_reference_pass(two_step_runs):
    # the table is computed over the ranks (each scores its share, then all-gathered) and looked up by dataset index
    # in shuffled batches: a lookup by position, or a rank holding only its own share, changes the rewards
    precomputed, every_step = two_step_runs["precomputed"], two_step_runs["two_ranks"]
    output = two_step_runs["precomputed_output"]
    assert "Reference log-probabilities of 32 training pairs computed once, over 2 ranks" in output
    assert sorted(precomputed) == sorted(every_step) == [1, 2]
    worst = max(max_difference(every_step, precomputed, key) for key in METRICS)
    print(f"LoRA DPO, precomputed reference: max |precomputed - every step| over {METRICS} = {worst:.1e}")
    assert worst <= 1e-6


@pytest.mark.slow
def test_accumulation_validation_resume_and_outputs(tiny_assets, start, tmp_path):
    """4 steps of 2 ranks x 1 pair x 2 accumulation steps equal 1 device x 4 pairs, validation included; resuming
    from step 2 reproduces steps 3 and 4; the outputs load in transformers and PEFT."""
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    common = ["max_steps_per_epoch=4", *_validation(start)]
    accumulate = ["batch_size=1", "gradient_accumulation_steps=2", "save_every_n_steps=2", *common]
    run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", *common), tmp_path),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, *accumulate), tmp_path),
    )
    reference, distributed = train_log(single), train_log(two)
    assert _compare(reference, distributed, METRICS, "LoRA DPO, accumulation") < 1e-5
    val_keys = ["val_loss", "val_rewards/accuracies", "val_rewards/margins", "val_logps/chosen"]
    assert _compare(reference, distributed, val_keys, "LoRA DPO, validation") < 1e-5

    # resume after a crash after step 2 (later checkpoints and the log gone)
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    for path in [resumed / "step_4", resumed / "logs"]:
        shutil.rmtree(path)
    run_distributed(
        RECIPE, CONFIG, _overrides(tiny_assets, start, resumed, *accumulate, "resume_from_checkpoint=True"), tmp_path
    )
    after = train_log(resumed)
    assert sorted(after) == [3, 4]
    worst = max(abs(after[s][k] - distributed[s][k]) for s in after for k in METRICS)
    print(f"LoRA DPO resumed at step 2: max |resumed - uninterrupted| over steps 3-4 = {worst:.1e}")
    assert worst <= 1e-6

    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = two / "step_4"
    tokens = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    with torch.no_grad():
        merged = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32).eval()(input_ids=tokens).logits
        with_adapter = PeftModel.from_pretrained(base, final / "adapter").eval()(input_ids=tokens).logits
        one_device = LlamaForCausalLM.from_pretrained(single / "step_4", dtype=torch.float32).eval()
        one_device_logits = one_device(input_ids=tokens).logits
    torch.testing.assert_close(with_adapter, merged, atol=1e-5, rtol=0)  # the adapter is the merged update
    torch.testing.assert_close(merged, one_device_logits, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_reference_free_loss_says_precomputing_has_no_effect(tiny_assets, start, tmp_path):
    simpo = ["loss._component_=tune.rlhf.loss.SimPOLoss", "~loss.beta", "max_steps_per_epoch=1"]
    overrides = _overrides(tiny_assets, start, tmp_path / "simpo", *simpo, "precompute_ref_log_probs=True")
    proc = run_distributed(RECIPE, CONFIG, overrides, tmp_path)
    output = proc.stdout + proc.stderr
    assert "precompute_ref_log_probs has no effect: tune.rlhf.loss.SimPOLoss" in output
    assert "Reference log-probabilities of" not in output
    assert train_log(tmp_path / "simpo")[1]["rewards/chosen"] != 0  # SimPO's reward: beta x mean log-prob


@pytest.mark.slow
def test_sft_data_and_tensor_parallelism_are_refused_clearly(tiny_assets, start, tmp_path):
    sft = ["dataset._component_=tune.datasets.alpaca_dataset", f"dataset.data_files={tiny_assets / 'train.json'}"]
    proc = run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, tmp_path / "a", *sft), tmp_path, check=False)
    assert proc.returncode != 0 and "DPO trains on preference pairs (chosen_input_ids" in proc.stderr
    proc = run_distributed(
        RECIPE, CONFIG, _overrides(tiny_assets, start, tmp_path / "b", "tensor_parallel_dim=2"), tmp_path, check=False
    )
    assert proc.returncode != 0 and "tensor_parallel_dim = 2: must be 1" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr
