"""Integration tests of recipes/reward_model_distributed.py: `tune run --nproc_per_node 2` (torchrun) on CPU with gloo,
on the tiny models and pre-tokenized pairs of test_reward_model_single_device.py.

The reference for full training is reward_model_single_device (itself checked against TRL's RewardTrainer) on the
same config and global batch: 2 ranks x 2 pairs see the same 4 pairs per step as 1 device x 4 pairs, from a
classifier checkpoint with a random score head. LoRA starts from a causal language model, so the adapters and the
score head are fresh: the single-device recipe draws them after initialising the whole model, the distributed one
on the meta device, so its reference is this recipe on 1 process with the same seed.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed
from tests.recipes.test_every_family import family_assets  # noqa: F401 - a fixture
from tests.recipes.test_reward_model_single_device import (
    CONFIGS,
    PAD_ID,
    _padded_batch,
    _tune_rewards,
    _write_checkpoint,
    _write_config,
)
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE, SINGLE = "reward_model_distributed", "reward_model_single_device"
METRICS = ["loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"]
NUM_STEPS = 4


def _config(tmp_path: Path, family: str, checkpoint: Path, name: str, *, lora: bool) -> Path:
    # shuffled pairs over 2 epochs of 2 steps (16 pairs, 4 per step), saved every step for the resume test
    config = _write_config(
        tmp_path, family, checkpoint, tmp_path / "unused", lora=lora, shuffle=True, max_steps_per_epoch=2, epochs=2
    )
    return config.rename(tmp_path / f"{name}.yaml")


def _overrides(out: Path, batch_size: int, *extra: str) -> list[str]:
    return [
        f"output_dir={out}",
        f"checkpointer.output_dir={out}",
        f"metric_logger.log_dir={out}/logs",
        f"batch_size={batch_size}",
        *extra,
    ]


def train_log(out: Path) -> dict[int, dict]:
    """Step -> the metrics logged at that step (training and validation records merged)."""
    (log,) = (out / "logs").glob("*.jsonl")
    steps: dict[int, dict] = {}
    for record in read_jsonl(log):
        steps.setdefault(record["step"], {}).update(record)
    return steps


def _weights(step_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(step_dir / "model.safetensors")


def _max_weight_difference(a: Path, b: Path) -> float:
    first, second = _weights(a), _weights(b)
    assert sorted(first) == sorted(second)
    return max((first[key] - second[key]).abs().max().item() for key in first)


def _compare(reference: dict, distributed: dict, label: str) -> float:
    worst = {key: max_difference(reference, distributed, key) for key in METRICS}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


def _hf_rewards(step_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(step_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens, attention_mask=(tokens != PAD_ID).long()).logits[:, 0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The four runs, side by side: full training on 1 device x 4 pairs and on 2 ranks x 2 pairs from a classifier
    checkpoint (llama3_2), LoRA on 1 process x 4 pairs and on 2 ranks x 2 pairs (saving every step) from a causal LM
    (qwen2_5)."""
    root = tmp_path_factory.mktemp("reward_distributed")
    full_dir, lora_dir = root / "full", root / "lora"
    full_dir.mkdir()
    lora_dir.mkdir()
    full_checkpoint = _write_checkpoint("llama3_2", full_dir / "hf", classifier=True)
    lora_checkpoint = _write_checkpoint("qwen2_5", lora_dir / "hf", classifier=False)
    full = _config(full_dir, "llama3_2", full_checkpoint, "full", lora=False)
    lora = _config(lora_dir, "qwen2_5", lora_checkpoint, "lora", lora=True)
    save = "save_every_n_steps=1"
    run_concurrently(
        lambda: run_recipe(SINGLE, full, _overrides(full_dir / "single", 4), full_dir),
        lambda: run_distributed(RECIPE, full, _overrides(full_dir / "two_ranks", 2), full_dir),
        lambda: run_distributed(RECIPE, lora, _overrides(lora_dir / "one_process", 4), lora_dir, nproc=1),
        lambda: run_distributed(RECIPE, lora, _overrides(lora_dir / "two_ranks", 2, save), lora_dir),
    )
    return {"full": full_dir, "lora": lora_dir, "lora_config": lora, "lora_checkpoint": lora_checkpoint}


def test_full_two_ranks_match_single_device(runs):
    """Full training, 4 shuffled steps over 2 epochs: 2 ranks x 2 pairs log the losses and reward metrics of the
    single-device recipe with 4 pairs, end with its weights, and the output loads in transformers with the
    recipe's rewards."""
    single, two = runs["full"] / "single", runs["full"] / "two_ranks"
    reference, distributed = train_log(single), train_log(two)
    assert sorted(distributed) == list(range(1, NUM_STEPS + 1))
    assert _compare(reference, distributed, "full reward model") < 1e-5
    final = f"step_{NUM_STEPS}"
    weights = _max_weight_difference(single / final, two / final)
    tokens = _padded_batch("llama3_2")
    ours = _tune_rewards("llama3_2", two / final, tokens)
    transformers_diff = (ours - _hf_rewards(two / final, tokens)).abs().max().item()
    print(f"full: max weight diff {weights:.1e}, rewards tune vs transformers {transformers_diff:.1e}")
    assert weights < 1e-5 and transformers_diff < 1e-5
    assert reference[1]["loss"] != pytest.approx(reference[NUM_STEPS]["loss"], abs=1e-3)  # the model did change


def test_lora_two_ranks_match_one_process_and_load_in_peft(runs):
    """LoRA from a causal LM (fresh adapters and score head): 2 ranks x 2 pairs equal 1 process x 4 pairs (losses,
    metrics, weights); the output's rewards in transformers and through the PEFT SEQ_CLS adapter on the causal
    base equal the recipe's."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    one, two = runs["lora"] / "one_process", runs["lora"] / "two_ranks"
    reference, distributed = train_log(one), train_log(two)
    assert sorted(distributed) == list(range(1, NUM_STEPS + 1))
    assert _compare(reference, distributed, "LoRA reward model") < 1e-5
    final = f"step_{NUM_STEPS}"
    weights = _max_weight_difference(one / final, two / final)
    tokens = _padded_batch("qwen2_5")
    ours = _tune_rewards("qwen2_5", two / final, tokens)
    transformers_diff = (ours - _hf_rewards(two / final, tokens)).abs().max().item()
    base = AutoModelForSequenceClassification.from_pretrained(
        runs["lora_checkpoint"], num_labels=1, pad_token_id=PAD_ID, dtype=torch.float32
    )
    peft_model = PeftModel.from_pretrained(base, two / final / "adapter").eval()
    with torch.no_grad():
        peft_rewards = peft_model(input_ids=tokens, attention_mask=(tokens != PAD_ID).long()).logits[:, 0]
    peft_diff = (ours - peft_rewards).abs().max().item()
    print(
        f"LoRA: max weight diff {weights:.1e}; rewards tune vs transformers {transformers_diff:.1e}, "
        f"vs PEFT {peft_diff:.1e}"
    )
    assert weights < 1e-5 and transformers_diff < 1e-5 and peft_diff < 1e-5


def test_lora_resume_equals_uninterrupted_run(runs):
    """Resumed from step 2's sharded checkpoint (a crash after step 2: later checkpoints and the log gone), the
    2-rank LoRA run logs the uninterrupted run's steps 3 and 4 and ends with its weights: the trained score head
    is part of the sharded state with the adapters."""
    two, resumed = runs["lora"] / "two_ranks", runs["lora"] / "resumed"
    final = f"step_{NUM_STEPS}"
    shutil.copytree(two, resumed)
    for path in [resumed / "step_3", resumed / final, resumed / "dcp" / "step_3", resumed / "logs"]:
        shutil.rmtree(path)
    overrides = _overrides(resumed, 2, "save_every_n_steps=1", "resume_from_checkpoint=True")
    run_distributed(RECIPE, runs["lora_config"], overrides, runs["lora"])
    after, uninterrupted = train_log(resumed), train_log(two)
    assert sorted(after) == [3, 4]
    resume_diff = max(abs(after[s][k] - uninterrupted[s][k]) for s in after for k in METRICS)
    resume_weights = _max_weight_difference(two / final, resumed / final)
    print(f"LoRA resumed at step 2: max metric diff {resume_diff:.1e}, max weight diff {resume_weights:.1e}")
    assert resume_diff < 1e-6 and resume_weights < 1e-6


# the shipped configs, each run at tiny scale by the test below (tests/recipes/test_every_config.py reads this)
SHIPPED_CONFIGS: dict[str, tuple[str, str]] = {
    "qwen3/8B_lora_reward.yaml": ("qwen3", "lora"),
    "qwen2_5/7B_full_reward.yaml": ("qwen2_5", "full"),
}


@pytest.mark.slow
@pytest.mark.parametrize("relative", sorted(SHIPPED_CONFIGS))
def test_shipped_config_trains_on_two_ranks(family_assets, tmp_path, relative):  # noqa: F811
    """Each shipped config at tiny scale on 2 ranks (the family's tiny checkpoint and tokenizer, the generated pairs
    as train and held-out data; the config's LoRA settings, optimizer, schedule and activation checkpointing
    kept): 4 steps with a validation, and the output loads as AutoModelForSequenceClassification."""
    from transformers import AutoModelForSequenceClassification

    family, method = SHIPPED_CONFIGS[relative]
    data = family_assets(family)
    out = tmp_path / "run"
    spec = assets.FAMILIES[family]
    builder = spec.builder if method == "full" else f"lora_{spec.builder}"
    dims = [f"model.base.{k}={json.dumps(v) if v is not None else 'null'}" for k, v in assets.tune_dims(family).items()]
    pairs = [f"{key}.source=json" for key in ("dataset", "dataset_val")]
    pairs += [f"{key}.data_files={data / 'pairs.json'}" for key in ("dataset", "dataset_val")]
    pairs += ["dataset_val.split=train"]
    overrides = [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        f"model.base._component_=tune.models.{spec.builder_module}.{builder}",
        *dims,
        f"tokenizer.path={assets.tokenizer_file(spec.tokenizer)}",
        f"tokenizer.max_seq_len={assets.MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={data / 'hf'}",
        "checkpointer.checkpoint_files=[model.safetensors]",
        *pairs,
        "batch_size=1",
        "gradient_accumulation_steps=1",
        f"max_steps_per_epoch={NUM_STEPS}",
        f"run_val_every_n_steps={NUM_STEPS}",
        "max_validation_steps=2",
        "optimizer.fused=False",
    ]
    if spec.tokenizer_builder:
        overrides.append(f"tokenizer._component_={spec.tokenizer_builder}")
    run_distributed(RECIPE, CONFIGS / relative, overrides, tmp_path)
    records = train_log(out)
    assert [s for s in sorted(records) if "loss" in records[s]] == list(range(1, NUM_STEPS + 1))
    assert any("val_accuracy" in r for r in records.values())
    model = AutoModelForSequenceClassification.from_pretrained(out / f"step_{NUM_STEPS}", dtype=torch.float32)
    assert model.score.weight.shape[0] == 1
