"""Integration tests of context parallelism (``context_parallel_dim``) in the DPO distributed recipes: `tune run
--nproc_per_node 2` (torchrun) on CPU with gloo, on the tiny Llama of tests/recipes/utils.py and generated preference
pairs (tests/recipes/_preference_assets.py).

The reference is the same recipe run without torchrun (a world of 1 process) on the same pairs per step. With
``context_parallel_dim: 2`` both ranks read the same batch and each scores 2 of the 4 chunks of every chosen and
rejected sequence (the policy's and the reference's passes); the per-sequence log-probability sums, logit sums and
token counts are added over the group before the loss. Only the order of float sums changes, so the loss and every
reward metric must agree to float32 rounding (1e-5 asked; relative for the summed log-probabilities, ~-30): a chunk
scored twice or missed moves the log-probabilities by whole tokens' worth. The padded pair batches are 36-45 tokens
long, some not a multiple of 4 (the recipe pads them); a completion is a sequence's last few tokens, so the ranks
score different shares of it row by row.
"""

from pathlib import Path

import pytest

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.test_context_parallel import first_batches
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

FULL, LORA = "full_dpo_distributed", "lora_dpo_distributed"
FULL_CONFIG, LORA_CONFIG = ASSETS / "full_dpo_tiny.yaml", ASSETS / "lora_dpo_tiny.yaml"
STEPS = 3
METRICS = [
    "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip
VAL_METRICS = ["val_loss", "val_rewards/chosen", "val_rewards/rejected", "val_rewards/margins", "val_logps/chosen"]


@pytest.fixture(scope="module")
def start(tiny_assets, tmp_path_factory):
    """32 training pairs, 7 held-out pairs and the LoRA runs' starting adapter (random A and B), written once."""
    root = tmp_path_factory.mktemp("cp_dpo")
    return {
        "pairs": write_preference_messages(root / "pairs.json", 32, seed=0),
        "held_out": write_preference_messages(root / "held_out.json", 7, seed=2),
        "adapter": random_peft_adapter(tiny_assets, root / "start_adapter"),
    }


def _overrides(assets: Path, start: dict, *extra: str) -> list[str]:
    """3 steps of 4 pairs, validated after the last (4 + 3 held-out pairs)."""
    node = "{_component_: tune.datasets.preference_dataset, source: json, split: train, data_files: %s}"
    node %= start["held_out"]
    return [
        f"assets_dir={assets}",
        f"dataset.data_files={start['pairs']}",
        f"max_steps_per_epoch={STEPS}",
        "batch_size=4",
        f"dataset_val={node}",
        f"run_val_every_n_steps={STEPS}",
        *extra,
    ]


def _run_and_compare(recipe: str, config: Path, overrides: list[str], cp_extra: list[str], cwd: Path, label: str):
    # the cp run's batches: padded, the default under context parallelism (one process defaults to padding-free)
    padded = [*overrides, "output_dir=unused", "collate_fn=tune.data.padded_collate_dpo"]
    batches = first_batches(config, padded, 4, STEPS)  # (tokens, labels) [8, s]
    assert any(tokens.shape[1] % 4 for tokens, _ in batches), [tokens.shape for tokens, _ in batches]
    one, cp = cwd / "one", cwd / "cp2"
    _, proc = run_concurrently(
        lambda: run_recipe(recipe, config, [*overrides, f"output_dir={one}"], cwd),
        lambda: run_distributed(
            recipe, config, [*overrides, f"output_dir={cp}", "context_parallel_dim=2", *cp_extra], cwd
        ),
    )
    assert "1 data-parallel shard(s) x 2 context-parallel" in proc.stderr
    reference, got = train_log(one), train_log(cp)
    assert sorted(reference) == sorted(got) == list(range(1, STEPS + 1))
    # the loss, rewards (differences of log-probabilities) and vocabulary-mean logits (~0.03) absolutely; the summed
    # log-probabilities (~-30) and the gradient norm relative to their size
    absolute = [k for k in METRICS + VAL_METRICS if "logps" not in k]
    worst = {key: max_difference(reference, got, key) for key in absolute}
    for key in [k for k in METRICS + VAL_METRICS if "logps" in k] + ["grad_norm"]:
        steps = [s for s in reference if key in reference[s]]
        worst[f"{key} (relative)"] = max(abs(got[s][key] / reference[s][key] - 1) for s in steps)
    print(f"{label}: max |cp=2 - 1 process| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    assert max(worst.values()) < 1e-5, worst
    return reference, proc.stdout + proc.stderr


def test_full_dpo_two_cp_ranks_match_one_process(tiny_assets, start, tmp_path):
    """The cp run accumulates 2 micro-batches of 2 pairs (the one-process run reads 4 at once), with activation
    checkpointing on; step 1 is ln 2 in both (the policy is the reference)."""
    overrides = _overrides(tiny_assets, start)
    cp_extra = ["batch_size=2", "gradient_accumulation_steps=2", "enable_activation_checkpointing=True"]
    reference, _ = _run_and_compare(FULL, FULL_CONFIG, overrides, cp_extra, tmp_path, "full DPO")
    assert reference[STEPS]["rewards/margins"] != 0  # the policy moved away from the reference


def test_lora_dpo_two_cp_ranks_match_one_process(tiny_assets, start, tmp_path):
    """From a random PEFT adapter: the policy differs from the reference (adapters off) from step 1. The cp run
    precomputes the reference's log-probabilities (whole sequences, each cp rank alike) before training."""
    overrides = _overrides(tiny_assets, start, f"checkpointer.adapter_checkpoint={start['adapter']}")
    cp_extra = ["precompute_ref_log_probs=True"]
    reference, output = _run_and_compare(LORA, LORA_CONFIG, overrides, cp_extra, tmp_path, "LoRA DPO")
    assert "Reference log-probabilities of 32 training pairs computed once" in output
    assert reference[1]["rewards/margins"] != 0
