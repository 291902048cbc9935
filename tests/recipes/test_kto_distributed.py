"""Integration tests of recipes/kto_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with gloo, on the
tiny Llama of tests/recipes/utils.py and generated preference pairs (tests/recipes/_preference_assets.py) read as
unpaired examples (``tune.datasets.unpaired_from_pairs``, KL groups of 4 in dataset order).

The reference is kto_single_device (itself checked against TRL's KTOTrainer in test_kto_single_device.py) on the same
config and global batch, shuffled: 2 ranks x 2 examples (or x 1 example x 2 accumulation steps) read the same 4
examples and KL rows per step as 1 device x 4 examples, so the losses, the KL estimates (over every KL row of the step
on both ranks), the reward metrics and the final weights must agree. LoRA starts from one PEFT adapter with random A and
B (``adapter_checkpoint``): the recipes draw fresh adapters differently, and a non-zero B makes the policy differ from
the reference (the model with adapters disabled) from step 1. Full fine-tuning starts from the tiny Llama, with a
frozen sharded copy of it as the reference (``ref_checkpointer``, or the checkpointer's weights when it is null).
"""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.test_kto_single_device import FULL
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

RECIPE, SINGLE = "kto_distributed", "kto_single_device"
CONFIG = ASSETS / "kto_tiny.yaml"  # LoRA rank 8, alpha 16 on q_proj, v_proj, output_proj and the MLP
METRICS = [
    "loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip
VAL_METRICS = ["val_loss", "val_kl", "val_rewards/margins", "val_logps/chosen", "val_desirable_rate"]
# full fine-tuning: the frozen reference read by ref_checkpointer (the same tiny Llama as the policy)
REFERENCE = [
    "ref_checkpointer._component_=tune.training.FullModelHFCheckpointer",
    "ref_checkpointer.checkpoint_dir=${assets_dir}/llama",
    "ref_checkpointer.checkpoint_files=[model.safetensors]",
    "ref_checkpointer.output_dir=${output_dir}",
    "ref_checkpointer.model_type=LLAMA2",
]


@pytest.fixture(scope="module")
def start(tiny_assets, tmp_path_factory):
    """32 training pairs (64 examples), 4 held-out pairs (8 examples) and the starting adapter, written once."""
    root = tmp_path_factory.mktemp("kto_distributed")
    return {
        "pairs": write_preference_messages(root / "pairs.json", 32, seed=0),
        "held_out": write_preference_messages(root / "held_out.json", 4, seed=1),
        "adapter": random_peft_adapter(tiny_assets, root / "start_adapter"),
    }


def _overrides(assets: Path, start: dict, out: Path, *extra: str) -> list[str]:
    held_out = (
        "{_component_: tune.datasets.unpaired_from_pairs, source: json, split: train, kl_group_size: 4, "
        f"data_files: {start['held_out']}}}"
    )
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"dataset.data_files={start['pairs']}",
        "shuffle=True",
        "optimizer.lr=3e-3",
        "loss.undesirable_weight=0.5",  # unequal weights: the KL estimate moves the loss
        f"dataset_val={held_out}",
        "run_val_every_n_steps=2",
        *extra,
    ]


def _lora(start: dict) -> str:
    return f"checkpointer.adapter_checkpoint={start['adapter']}"


def _compare(reference: dict, distributed: dict, keys: list[str], label: str) -> float:
    worst = {key: max_difference(reference, distributed, key) for key in keys}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


def _max_weight_difference(a: Path, b: Path) -> float:
    first, second = load_file(a), load_file(b)
    assert sorted(first) == sorted(second)
    return max((first[key] - second[key]).abs().max().item() for key in first)


@pytest.fixture(scope="module")
def lora_runs(tiny_assets, start, tmp_path_factory):
    """3 shuffled LoRA steps, validated at step 2: 1 device x 4 examples and 2 ranks x 2 examples, side by side."""
    root = tmp_path_factory.mktemp("kto_distributed_lora")
    single, two = root / "single", root / "two_ranks"
    common = ["max_steps_per_epoch=3", _lora(start)]
    run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", *common), root),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, "batch_size=2", *common), root),
    )
    return {"single": single, "two_ranks": two}


def test_lora_two_ranks_match_one_device(lora_runs):
    """Per step: the loss, the KL estimate and every KTO metric (all-reduced over the ranks), the validation's (its
    desirable rate over the examples of both ranks) and the final adapter equal the single-device run's."""
    reference, distributed = train_log(lora_runs["single"]), train_log(lora_runs["two_ranks"])
    assert sorted(distributed) == [1, 2, 3]
    assert _compare(reference, distributed, METRICS, "LoRA KTO") < 1e-5
    assert max_difference(reference, distributed, "grad_norm") < 1e-5 * reference[1]["grad_norm"]
    assert _compare(reference, distributed, VAL_METRICS, "LoRA KTO, validation") < 1e-5
    assert reference[1]["rewards/margins"] != 0 and reference[3]["kl"] > 0  # non-trivial values compared
    adapter = "step_3/adapter/adapter_model.safetensors"
    worst = _max_weight_difference(lora_runs["single"] / adapter, lora_runs["two_ranks"] / adapter)
    print(f"LoRA KTO final adapter: max |2 ranks - 1 device| = {worst:.1e}")
    assert worst < 1e-5


def test_lora_outputs_load_in_transformers_and_peft(tiny_assets, lora_runs):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = lora_runs["two_ranks"] / "step_3"
    tokens = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        merged, info = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        merged_logits = merged.eval()(input_ids=tokens).logits
        peft_logits = PeftModel.from_pretrained(base, final / "adapter").eval()(input_ids=tokens).logits
    worst = (merged_logits - peft_logits).abs().max().item()
    print(f"LoRA KTO outputs: max |merged - PEFT| logits = {worst:.1e}")
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=0)  # the adapter is the merged update
    assert (peft_logits - base_logits).abs().max() > 1e-3  # the adapter learned something to compare


def _crash_and_resume(run: Path, out: Path, overrides: list[str], cwd: Path, final_step: int) -> dict[int, dict]:
    """A crash after step 2 (the later checkpoint and the log gone), resumed on 2 ranks: the resumed run's log."""
    shutil.copytree(run, out)
    for path in [out / f"step_{final_step}", out / "logs"]:
        shutil.rmtree(path)
    run_distributed(RECIPE, CONFIG, [*overrides, "resume_from_checkpoint=True"], cwd)
    return train_log(out)


@pytest.mark.slow
def test_lora_resume_equals_the_uninterrupted_run(tiny_assets, start, tmp_path):
    """4 steps of 2 ranks x 1 example x 2 accumulation steps, saved at step 2; resumed from there, steps 3 and 4 and
    the final adapter are the uninterrupted run's."""
    run = tmp_path / "run"
    common = ["batch_size=1", "gradient_accumulation_steps=2", "max_steps_per_epoch=4", "save_every_n_steps=2"]
    run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, run, *common, _lora(start)), tmp_path)
    resumed = tmp_path / "resumed"
    after = _crash_and_resume(run, resumed, _overrides(tiny_assets, start, resumed, *common, _lora(start)), tmp_path, 4)
    uninterrupted = train_log(run)
    assert sorted(after) == [3, 4]
    worst = max(abs(after[s][k] - uninterrupted[s][k]) for s in after for k in METRICS)
    adapter = "step_4/adapter/adapter_model.safetensors"
    weights = _max_weight_difference(run / adapter, resumed / adapter)
    print(f"LoRA KTO resumed at step 2: max |resumed - uninterrupted| metrics {worst:.1e}, adapter {weights:.1e}")
    assert worst <= 1e-6 and weights <= 1e-6


@pytest.mark.slow
def test_full_two_ranks_with_accumulation_match_one_device_and_resume(tiny_assets, start, tmp_path):
    """Full fine-tuning against a frozen sharded reference: 4 steps of 2 ranks x 1 example x 2 accumulation steps
    equal 1 device x 4 examples (its frozen reference a copy of the starting weights), validation included; resumed
    after step 2 (the reference now read from the checkpointer's starting weights, ref_checkpointer null), steps 3
    and 4 and the final weights are the uninterrupted run's; the output loads in transformers."""
    single, two = tmp_path / "single", tmp_path / "two_ranks"
    # Adam's steps on 4 examples at 1e-3 (3e-3 for LoRA): a small step keeps the 2-rank rounding well within 1e-5
    common = [*FULL, "max_steps_per_epoch=4", "optimizer.lr=1e-3"]
    accumulate = ["batch_size=1", "gradient_accumulation_steps=2", "save_every_n_steps=2", *common]
    _, proc = run_concurrently(
        lambda: run_recipe(SINGLE, CONFIG, _overrides(tiny_assets, start, single, "batch_size=4", *common), tmp_path),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, two, *accumulate, *REFERENCE), tmp_path),
    )  # fmt: skip
    assert "Reference: a frozen copy of ref_checkpointer, sharded over 2 ranks" in proc.stdout + proc.stderr
    reference, distributed = train_log(single), train_log(two)
    assert _compare(reference, distributed, METRICS, "full KTO, accumulation") < 1e-5
    # a validation batch is its own KL group (batch_size rows per rank): 2 x 1 rows here, 4 on one device, so only
    # the validation metrics that do not depend on the KL estimate are compared (the LoRA test compares them all)
    val_keys = ["val_rewards/margins", "val_logps/chosen", "val_logps/rejected", "val_desirable_rate"]
    assert _compare(reference, distributed, val_keys, "full KTO, validation") < 1e-5
    assert reference[4]["rewards/margins"] != 0 and reference[4]["kl"] > 0
    worst = _max_weight_difference(single / "step_4/model.safetensors", two / "step_4/model.safetensors")
    print(f"full KTO final weights: max |2 ranks - 1 device| = {worst:.1e}")
    assert worst < 1e-5

    resumed = tmp_path / "resumed"
    after = _crash_and_resume(two, resumed, _overrides(tiny_assets, start, resumed, *accumulate), tmp_path, 4)
    assert sorted(after) == [3, 4]
    worst = max(abs(after[s][k] - distributed[s][k]) for s in after for k in METRICS)
    weights = _max_weight_difference(two / "step_4/model.safetensors", resumed / "step_4/model.safetensors")
    print(f"full KTO resumed at step 2: max |resumed - uninterrupted| metrics {worst:.1e}, weights {weights:.1e}")
    assert worst <= 1e-6 and weights <= 1e-6

    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(two / "step_4", dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    trained = dict(model.named_parameters())
    start_model = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    moved = max((trained[n] - p).abs().max().item() for n, p in start_model.named_parameters())
    assert moved > 1e-3  # the policy trained; the reference (the starting weights) is not part of the output


@pytest.mark.slow
def test_tensor_parallelism_and_sft_data_are_refused_clearly(tiny_assets, start, tmp_path):
    proc = run_distributed(
        RECIPE, CONFIG, _overrides(tiny_assets, start, tmp_path / "a", "tensor_parallel_dim=2"), tmp_path, check=False
    )
    assert proc.returncode != 0 and "tensor_parallel_dim = 2: must be 1" in proc.stderr
    sft = ["dataset._component_=tune.datasets.alpaca_dataset", f"dataset.data_files={tiny_assets / 'train.json'}"]
    sft.append("~dataset.kl_group_size")
    proc = run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, start, tmp_path / "b", *sft), tmp_path, check=False)
    assert proc.returncode != 0 and "KTO trains on unpaired examples" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr
