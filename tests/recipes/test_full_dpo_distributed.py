"""Integration tests of recipes/full_dpo_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with gloo,
on the tiny Llama of tests/recipes/utils.py and generated preference pairs (tests/recipes/_preference_assets.py).

The policy and the frozen reference are both read from the tiny Llama (tests/recipes/assets/full_dpo_tiny.yaml:
``checkpointer`` and ``ref_checkpointer``), so at step 1 policy == reference: the DPO loss is ln 2 and every reward
is 0. torchtune ships no single-device full DPO recipe; the single-device references are a plain PyTorch loop over
the Hugging Face model (full DPO written out here, in this process) and, in the slow tier, the same recipe on one
process, each with the same global batch: 2 ranks x 2 pairs (or x 1 pair x 2 accumulation steps) see the same 4 pairs
per step as 1 device x 4 pairs. With ``precompute_ref_log_probs`` the reference's log-probs are a table computed
before training and the reference model is released; the run with it is compared with the run without it.
"""

import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.utils import ASSETS

pytestmark = pytest.mark.integration

RECIPE = "full_dpo_distributed"
CONFIG = ASSETS / "full_dpo_tiny.yaml"
LR, BETA = 1e-3, 0.1
METRICS = [
    "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """32 training pairs, 8 held-out pairs and 7 more (2 ranks get 4 each: one repeated) in messages form."""
    root = tmp_path_factory.mktemp("full_dpo_pairs")
    return {
        "train": write_preference_messages(root / "pairs.json", 32, seed=0),
        "held_out": write_preference_messages(root / "held_out.json", 8, seed=1),
        "held_out_odd": write_preference_messages(root / "held_out_odd.json", 7, seed=2),
    }


def _validation(held_out: Path, every: int) -> list[str]:
    node = f"{{_component_: tune.datasets.preference_dataset, source: json, split: train, data_files: {held_out}}}"
    return [f"dataset_val={node}", f"run_val_every_n_steps={every}"]


@pytest.fixture(scope="module")
def shuffled_runs(tiny_assets, pairs, tmp_path_factory):
    """2 shuffled steps on 2 ranks x 2 pairs, validated at step 2 (7 pairs), with and without
    precompute_ref_log_probs, and the plain loop on the same 4 pairs per step: run side by side."""
    root = tmp_path_factory.mktemp("full_dpo_shuffled")
    common = ["batch_size=2", "max_steps_per_epoch=2", "shuffle=True", *_validation(pairs["held_out_odd"], 2)]
    every_step, precomputed = root / "every_step", root / "precomputed"
    _, proc, plain = run_concurrently(
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, pairs, every_step, *common), root),
        lambda: run_distributed(
            RECIPE, CONFIG, _overrides(tiny_assets, pairs, precomputed, *common, "precompute_ref_log_probs=True"), root
        ),
        lambda: _plain_dpo(tiny_assets, pairs["train"], _shuffled_steps(32, num_steps=2, batch_size=2)),
    )
    return {
        "every_step": train_log(every_step),
        "precomputed": train_log(precomputed),
        "precomputed_output": proc.stdout + proc.stderr,
        "plain": plain,
    }


def _shuffled_steps(num_pairs: int, num_steps: int, batch_size: int, num_ranks: int = 2) -> list[list[int]]:
    """The dataset indices each step of the recipe reads on all ranks together: rank r's shard of the recipe's
    sampler (seed 0, epoch 0), batch after batch."""
    from tune.training.checkpointing import StatefulDistributedSampler

    shards = []
    for rank in range(num_ranks):
        sampler = StatefulDistributedSampler(range(num_pairs), num_replicas=num_ranks, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        shards.append(list(sampler))
    return [
        [index for shard in shards for index in shard[step * batch_size : (step + 1) * batch_size]]
        for step in range(num_steps)
    ]


def _overrides(assets: Path, pairs: dict, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"dataset.data_files={pairs['train']}", *extra]


def _compare(reference: dict, distributed: dict, keys: list[str], label: str) -> float:
    worst = {key: max_difference(reference, distributed, key) for key in keys}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


def test_two_ranks_match_a_plain_loop_on_one_device_and_step_one_is_ln2(shuffled_runs):
    plain, distributed = shuffled_runs["plain"], shuffled_runs["every_step"]
    first = distributed[1]
    print(f"full DPO step 1 (2 ranks): loss {first['loss']:.9f}, ln 2 = {math.log(2):.9f}")
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6, rel=0)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert first[key] == 0, key
    assert _compare(plain, distributed, PLAIN_METRICS, "full DPO vs a plain loop") < 1e-5
    assert distributed[2]["rewards/margins"] != 0  # step 1 moved the policy away from the reference


def test_precomputed_reference_log_probs_train_as_the_reference_model_and_release_it(shuffled_runs):
    # the table is computed over the ranks (each scores its share, then all-gathered), looked up by dataset index
    # in shuffled batches: a lookup by position, or a rank holding only its own share, changes the rewards
    precomputed, every_step = shuffled_runs["precomputed"], shuffled_runs["every_step"]
    output = shuffled_runs["precomputed_output"]
    assert "Reference log-probabilities of 32 training pairs computed once, over 2 ranks" in output
    assert "Reference log-probabilities of 7 validation pairs computed once, over 2 ranks" in output
    # no reference model during training: nothing holds it once the tables exist (checked with a weak reference)
    assert "Reference model released: training holds no reference weights" in output, output[-3000:]
    assert sorted(precomputed) == sorted(every_step) == [1, 2]
    val_keys = ["val_loss", "val_rewards/chosen", "val_rewards/rejected", "val_rewards/accuracies"]
    val_keys += ["val_rewards/margins", "val_logps/chosen", "val_logps/rejected"]
    # step 1: the policy is the reference, so the precomputed run's rewards are 0 up to the rounding of another
    # batching, and rewards/accuracies there is the sign of that rounding: the rewards are compared, not their sign
    assert max(abs(precomputed[1]["rewards/chosen"]), abs(precomputed[1]["rewards/rejected"])) < 1e-6
    worst = {key: max_difference(every_step, precomputed, key) for key in METRICS + val_keys}
    worst["rewards/accuracies"] = abs(every_step[2]["rewards/accuracies"] - precomputed[2]["rewards/accuracies"])
    print(
        "full DPO, precomputed reference: max |precomputed - every step| "
        + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    )
    assert max(worst.values()) <= 1e-6, worst
    assert every_step[2]["val_rewards/margins"] != 0  # validation after a step: the reference matters


@pytest.mark.slow
def test_accumulation_validation_resume_and_outputs(tiny_assets, pairs, tmp_path):
    """4 steps of 2 ranks x 1 pair x 2 accumulation steps equal 1 device x 4 pairs, validation included; resuming
    from step 2 reproduces steps 3 and 4 and the final weights; the output loads in transformers."""
    one, two = tmp_path / "one", tmp_path / "two_ranks"
    validation = (
        f"dataset_val={{_component_: tune.datasets.preference_dataset, source: json, split: train, "
        f"data_files: {pairs['held_out']}}}"
    )
    common = ["max_steps_per_epoch=4", "shuffle=True", validation, "run_val_every_n_steps=2"]
    accumulate = ["batch_size=1", "gradient_accumulation_steps=2", "save_every_n_steps=2", *common]
    run_concurrently(
        lambda: run_distributed(
            RECIPE, CONFIG, _overrides(tiny_assets, pairs, one, "batch_size=4", *common), tmp_path, 1
        ),
        lambda: run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, pairs, two, *accumulate), tmp_path),
    )
    reference, distributed = train_log(one), train_log(two)
    assert _compare(reference, distributed, METRICS, "full DPO, accumulation") < 1e-5
    val_keys = ["val_loss", "val_rewards/accuracies", "val_rewards/margins", "val_logps/chosen"]
    assert _compare(reference, distributed, val_keys, "full DPO, validation") < 1e-5

    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    for path in [resumed / "step_4", resumed / "logs"]:
        shutil.rmtree(path)
    overrides = _overrides(tiny_assets, pairs, resumed, *accumulate, "resume_from_checkpoint=True")
    run_distributed(RECIPE, CONFIG, overrides, tmp_path)
    after = train_log(resumed)
    assert sorted(after) == [3, 4]
    worst = max(abs(after[s][k] - distributed[s][k]) for s in after for k in METRICS)
    print(f"full DPO resumed at step 2: max |resumed - uninterrupted| over steps 3-4 = {worst:.1e}")
    assert worst <= 1e-6

    from transformers import LlamaForCausalLM

    def load(directory: Path):
        model, info = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        return model

    final, resumed_final, one_device = load(two / "step_4"), load(resumed / "step_4"), load(one / "step_4")
    for (name, param), resumed_param, one_param in zip(
        final.named_parameters(), resumed_final.parameters(), one_device.parameters()
    ):
        torch.testing.assert_close(resumed_param, param, atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(one_param, param, atol=1e-5, rtol=0, msg=name)
    start = load(tiny_assets / "llama")
    moved = max((a - b).abs().max().item() for a, b in zip(final.parameters(), start.parameters()))
    assert moved > 1e-3  # the policy trained; the reference (the starting weights) is not part of the output


@pytest.mark.slow
def test_a_reference_free_loss_builds_no_reference_and_dpo_needs_one(tiny_assets, pairs, tmp_path):
    simpo = ["loss._component_=tune.rlhf.loss.SimPOLoss", "~loss.beta", "max_steps_per_epoch=1", "batch_size=2"]
    simpo.append("precompute_ref_log_probs=True")
    proc = run_distributed(RECIPE, CONFIG, _overrides(tiny_assets, pairs, tmp_path / "simpo", *simpo), tmp_path)
    output = proc.stdout + proc.stderr
    assert "SimPOLoss (no reference model)" in output and "Reference (frozen)" not in output
    assert "ref_checkpointer has no effect" in output
    # a reference-free loss has no reference log-probs to precompute: said, not silently ignored
    assert "precompute_ref_log_probs has no effect: tune.rlhf.loss.SimPOLoss" in output
    assert train_log(tmp_path / "simpo")[1]["rewards/chosen"] != 0  # SimPO's reward: beta x mean log-prob
    no_reference = _overrides(tiny_assets, pairs, tmp_path / "dpo", "ref_checkpointer=null", "max_steps_per_epoch=1")
    proc = run_distributed(RECIPE, CONFIG, no_reference, tmp_path, check=False)
    assert proc.returncode != 0 and "ref_checkpointer: is null, but tune.rlhf.loss.DPOLoss compares" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr


# what the plain loop computes (the logits metrics are left to the recipe-against-recipe comparison)
PLAIN_METRICS = [
    "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
    "logps/rejected",
]  # fmt: skip


def _plain_dpo(assets: Path, pairs_file: Path, steps: list[list[int]]) -> dict[int, dict]:
    """Full DPO in plain PyTorch on the Hugging Face model: ``steps[i]`` the dataset indices of step i + 1's pairs,
    tokenised by tune's preference dataset, summed completion log-probabilities by hand,
    ``-logsigmoid(beta * margin)`` averaged over the step's pairs, ``torch.optim.AdamW`` at the config's settings.
    Returns step -> the loss and TRL's reward metrics."""
    from transformers import LlamaForCausalLM

    from tune.datasets import preference_dataset
    from tune.models.llama2 import llama2_tokenizer

    tokenizer = llama2_tokenizer(str(assets / "tokenizer.model"), max_seq_len=256, prompt_template=None)
    dataset = preference_dataset(tokenizer, source="json", data_files=str(pairs_file), split="train")
    policy = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32).train()
    reference = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0, foreach=False)

    def log_prob(model, ids: list[int], labels: list[int]) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        targets = torch.tensor(labels[1:])
        scored = targets != -100
        return torch.log_softmax(logits, dim=-1)[scored, targets[scored]].sum()

    records = {}
    for step, indices in enumerate(steps, start=1):
        batch_size = len(indices)
        values = []  # per pair: loss, chosen reward, rejected reward, policy chosen and rejected log-probs
        for pair in (dataset[index] for index in indices):
            sides = [(pair[f"{s}_input_ids"], pair[f"{s}_labels"]) for s in ("chosen", "rejected")]
            with torch.no_grad():
                ref_chosen, ref_rejected = (log_prob(reference, *side) for side in sides)
            chosen, rejected = (log_prob(policy, *side) for side in sides)
            margin = (chosen - ref_chosen) - (rejected - ref_rejected)
            loss = -F.logsigmoid(BETA * margin)
            (loss / batch_size).backward()
            rewards = BETA * (chosen - ref_chosen).detach(), BETA * (rejected - ref_rejected).detach()
            values.append(torch.stack([loss.detach(), *rewards, chosen.detach(), rejected.detach()]))
        optimizer.step()
        optimizer.zero_grad()
        loss, chosen_reward, rejected_reward, chosen, rejected = torch.stack(values).T
        records[step] = {
            "loss": loss.mean().item(),
            "rewards/chosen": chosen_reward.mean().item(),
            "rewards/rejected": rejected_reward.mean().item(),
            "rewards/accuracies": (chosen_reward > rejected_reward).float().mean().item(),
            "rewards/margins": (chosen_reward - rejected_reward).mean().item(),
            "logps/chosen": chosen.mean().item(),
            "logps/rejected": rejected.mean().item(),
        }
    return records
