"""Every shipped PPO config trains (slow tier): configs/mistral/7B_full_ppo_low_memory.yaml and
configs/llama3_2/1B_full_ppo_single_device.yaml, copied as shipped and run with ppo_full_finetune_single_device for 2
PPO steps on the family's tiny assets (tests/recipes/_family_assets.py), then the policy and the value model load in
transformers.

The policy and its reference read the family's tiny checkpoint; the reward model and the value model read a tiny
``*ForSequenceClassification`` (one label) with that checkpoint's body and a random score head, as the shipped
configs pair an instruct model with a reward model of the same family. Only the command line changes the config:
tiny dimensions of both model nodes, the tiny tokenizer, the checkpoint directories, a tiny prompt file, CPU and fp32,
and batch sizes that make 2 PPO steps of 4 trajectories; anything else is in ``CPU_OVERRIDES`` with its reason.
"""

import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes import _family_assets as assets
from tests.recipes.test_every_family import _copy_config, _load_strict, family_assets  # noqa: F401 - a fixture
from tests.recipes.test_ppo_full_finetune_single_device import _write_prompts
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "ppo_full_finetune_single_device"
STEPS, BATCH = 2, 4
CASES = {"mistral": "mistral/7B_full_ppo_low_memory.yaml", "llama3_2": "llama3_2/1B_full_ppo_single_device.yaml"}
# The dimensions of the reward-and-value node the tiny model replaces (its other settings are the shipped ones).
CLASSIFIER_DIMS = ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "embed_dim", "intermediate_dim")

# Overrides beyond dimensions, tokenizer, data, paths, device, dtype and batch sizes that a shipped config needs on
# CPU, each with its reason (each one a finding about that config); none is needed. The Mistral config's
# `compile: True` is kept: torch.compile of the four tiny models on CPU adds about 25 s.
CPU_OVERRIDES: list[str] = []


def test_every_shipped_ppo_config_is_a_case():
    shipped = {path.relative_to(assets.CONFIGS).as_posix() for path in assets.CONFIGS.glob("*/*_ppo*.yaml")}
    assert shipped == set(CASES.values())


def _save_reward_model(family: str, policy_dir: Path, out: Path) -> None:
    """A one-label ``*ForSequenceClassification`` of the tiny config: the policy checkpoint's body, a random head."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = assets.hf_config(family)
    config.num_labels, config.pad_token_id = 1, assets._tokenizer(family).pad_id
    config.tie_word_embeddings = False  # the score head is never tied
    model = AutoModelForSequenceClassification.from_config(config)
    causal = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    state = {k: v for k, v in causal.state_dict().items() if k.startswith("model.")}
    state["score.weight"] = 0.2 * torch.randn(1, config.hidden_size, generator=torch.Generator().manual_seed(5))
    model.load_state_dict(state)
    model.save_pretrained(out, safe_serialization=True)


def _ppo_overrides(family: str, config: Path, data: Path, reward_dir: Path, prompts: Path, out: Path) -> list[str]:
    shipped = yaml.safe_load(config.read_text())
    dims = assets.tune_dims(family)
    policy = ["policy_" + override for override in assets.model_overrides(family, "full")]
    classifier = [f"reward_and_value_model.{key}={dims[key]}" for key in CLASSIFIER_DIMS]
    classifier.append(f"reward_and_value_model.max_seq_len={assets.MAX_SEQ_LEN}")
    checkpoints = []
    for node, directory in (
        ("checkpointer", data / "hf"),
        ("ref_policy_checkpointer", data / "hf"),
        ("value_checkpointer", reward_dir),
        ("reward_checkpointer", reward_dir),
    ):
        checkpoints.append(f"{node}.checkpoint_dir={directory}")
        if shipped[node]["checkpoint_files"] is not None:  # the shipped shard names; null reads every file
            checkpoints.append(f"{node}.checkpoint_files=[model.safetensors]")
    # 2 PPO steps of BATCH trajectories, with the shipped micro-batch split (ppo_batch_size / accumulation) kept
    # where it fits: ppo_batch_size and forward_batch_size scaled to the batch
    ppo_batch = BATCH * shipped["ppo_batch_size"] // shipped["batch_size"]
    forward_batch = min(BATCH, shipped["forward_batch_size"])
    sizes = [f"batch_size={BATCH}", f"num_steps={STEPS * BATCH}", f"ppo_batch_size={ppo_batch}"]
    sizes.append(f"forward_batch_size={forward_batch}")
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        f"tokenizer.path={assets.tokenizer_file(assets.FAMILIES[family].tokenizer)}",
        *policy,
        *classifier,
        *checkpoints,
        "dataset.source=json",
        f"dataset.data_files={prompts}",
        *sizes,
        *CPU_OVERRIDES,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CASES))
def test_shipped_ppo_config_trains_and_loads_in_hf(family_assets, tmp_path, family):  # noqa: F811
    data = family_assets(family)
    config = _copy_config(CASES[family], tmp_path)
    reward_dir = tmp_path / "reward_model"
    _save_reward_model(family, data / "hf", reward_dir)
    prompts = _write_prompts(tmp_path / "prompts.json", 16)
    out = tmp_path / "run"
    run_recipe(
        RECIPE, config, _ppo_overrides(family, config, data, reward_dir, prompts, out), cwd=tmp_path, timeout=300
    )
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        for key in ("loss", "policy_loss", "value_loss", "scores", "kl", "rlhf_reward"):
            assert math.isfinite(record[key]), (key, record)
    final = out / f"step_{STEPS}"
    _load_strict(final)
    trained, start = load_file(final / "model.safetensors"), load_file(data / "hf" / "model.safetensors")
    assert trained.keys() == start.keys()
    assert max((trained[k] - start[k]).abs().max().item() for k in start) > 0  # the policy was trained
    _load_value_model_strict(out / "value" / f"step_{STEPS}")


def _load_value_model_strict(directory: Path) -> None:
    """The value model's output loads as a one-label sequence classifier, every weight found and used."""
    from transformers import AutoModelForSequenceClassification

    model, info = AutoModelForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems and model.config.num_labels == 1, (directory, problems)
