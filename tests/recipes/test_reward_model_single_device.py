"""reward_model_single_device: per-step losses against TRL's RewardTrainer on the same tiny model and pairs, the
output read by transformers (and PEFT) with the recipe's rewards, exact resume, and learning on generated pairs.

Expected numbers come from the reference run in the test (TRL 1.16's RewardTrainer, transformers' classifiers)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.recipes.test_every_family import family_assets  # noqa: F401 - a fixture
from tests.recipes.utils import read_jsonl, run_recipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

RECIPE = "reward_model_single_device"
PAD_ID = 0
NUM_STEPS = 4

# the components a test config names: a tokenizer with a pad id, and pre-tokenized pairs (token ids 1..vocab-1)
_COMPONENTS = """
import random
from types import SimpleNamespace

from torch.utils.data import Dataset


class Pairs(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def tokenizer(max_seq_len=64):
    return SimpleNamespace(pad_id=0, max_seq_len=max_seq_len)


def pairs(tokenizer, num_pairs=16, seed=0, vocab_size=64, with_margin=False):
    rng = random.Random(seed)
    rows = []
    for _ in range(num_pairs):
        chosen = [rng.randrange(1, vocab_size) for _ in range(rng.randrange(3, 12))]
        rejected = [rng.randrange(1, vocab_size) for _ in range(rng.randrange(3, 12))]
        row = {"chosen_input_ids": chosen, "chosen_labels": chosen, "rejected_input_ids": rejected,
               "rejected_labels": rejected}
        if with_margin:
            row["margin"] = round(rng.uniform(0.0, 1.0), 3)
        rows.append(row)
    return Pairs(rows)
"""


def _hf_config(family: str, classifier: bool):
    config = assets.hf_config(family)
    config.pad_token_id = PAD_ID
    if classifier:
        config.num_labels = 1
        config.architectures = [type(config).__name__.removesuffix("Config") + "ForSequenceClassification"]
    return config


def _write_checkpoint(family: str, where: Path, classifier: bool) -> Path:
    """A tiny transformers checkpoint: a causal LM, or a sequence classifier with a random score head."""
    from transformers import AutoModelForSequenceClassification

    from tests.tune.models._hf_cases import build_hf_model

    model = build_hf_model(_hf_config(family, classifier=False), seed=0)
    if classifier:
        classifier_model = AutoModelForSequenceClassification.from_config(_hf_config(family, classifier=True))
        missing, _ = classifier_model.load_state_dict(model.state_dict(), strict=False)
        assert missing == ["score.weight"], missing
        torch.manual_seed(1)
        with torch.no_grad():
            classifier_model.score.weight.normal_(0.0, 0.5)
        model = classifier_model
    model.save_pretrained(where, safe_serialization=True)
    return where


def _model_node(family: str, lora: bool) -> dict:
    spec = assets.FAMILIES[family]
    builder = f"lora_{spec.builder}" if lora else spec.builder
    base = {"_component_": f"tune.models.{spec.builder_module}.{builder}", **assets.tune_dims(family)}
    if lora:
        base.update(lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_mlp=True, lora_rank=4, lora_alpha=8)
    return {"_component_": "tune.models.classifier_model", "num_classes": 1, "base": base}


def _write_config(tmp_path: Path, family: str, checkpoint: Path, out: Path, *, lora: bool, **extra) -> Path:
    (tmp_path / "reward_components.py").write_text(_COMPONENTS)
    model_type = "REWARD" if (checkpoint / "config.json").read_text().count("ForSequenceClassification") else family
    cfg = {
        "output_dir": str(out),
        "model": _model_node(family, lora),
        "tokenizer": {"_component_": "reward_components.tokenizer"},
        "checkpointer": {
            "_component_": "tune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(checkpoint),
            "checkpoint_files": ["model.safetensors"],
            "output_dir": str(out),
            "model_type": model_type.upper(),
        },
        "resume_from_checkpoint": False,
        "dataset": {
            "_component_": "reward_components.pairs",
            "vocab_size": assets.vocab_size(family),
            "with_margin": True,
        },
        "collate_fn": None,  # the CPU default: tune.data.padding_free_collate_dpo
        "seed": 0,
        "shuffle": False,
        "batch_size": 2,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.0},
        "loss": {"_component_": "tune.rlhf.loss.RewardModelLoss", "center_rewards_coefficient": 0.01},
        "epochs": 1,
        "max_steps_per_epoch": NUM_STEPS,
        "gradient_accumulation_steps": 1,
        "metric_logger": {"_component_": "tune.training.metric_logging.DiskLogger", "log_dir": f"{out}/logs"},
        "device": "cpu",
        "dtype": "fp32",
        **extra,
    }
    path = tmp_path / f"reward_{family}.yaml"
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return path


def _records(out: Path) -> list[dict]:
    (log,) = (out / "logs").glob("*.jsonl")
    return [r for r in read_jsonl(log) if "loss" in r]


def _pairs(family: str, **kwargs) -> list[dict]:
    namespace: dict = {}
    exec(_COMPONENTS, namespace)  # the same rows the recipe reads
    return namespace["pairs"](None, vocab_size=assets.vocab_size(family), **kwargs).rows


def _trl_losses(family: str, checkpoint: Path, tmp_path: Path, rows: list[dict], center: float) -> list[dict]:
    """TRL's RewardTrainer on the same model, pairs (in order), optimizer and margins: its logged records."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast
    from trl import RewardConfig, RewardTrainer

    vocab = {f"t{i}": i for i in range(assets.vocab_size(family))}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")), pad_token="t0", eos_token="t1"
    )

    class SequentialRewardTrainer(RewardTrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32)
    data = Dataset.from_list(
        [
            {"chosen_ids": r["chosen_input_ids"], "rejected_ids": r["rejected_input_ids"], "margin": r["margin"]}
            for r in rows
        ]
    )
    args = RewardConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1e9,  # no clipping, as the recipe's clip_grad_norm: null
        max_steps=NUM_STEPS,
        logging_steps=1,
        optim="adamw_torch",
        center_rewards_coefficient=center,
        gradient_checkpointing=False,
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16; the recipe runs fp32
        save_strategy="no",
        seed=0,
        dataloader_drop_last=True,
    )
    trainer = SequentialRewardTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]


def test_full_matches_trl_reward_trainer(tmp_path):
    """Full training of a tiny Llama classifier over 4 steps of 2 pairs (unequal lengths, right padding, per-pair
    margins, reward centering) logs TRL's RewardTrainer losses and metrics step by step."""
    family = "llama3_2"
    checkpoint = _write_checkpoint(family, tmp_path / "hf", classifier=True)
    out = tmp_path / "run"
    run_recipe(RECIPE, _write_config(tmp_path, family, checkpoint, out, lora=False), [], cwd=tmp_path)
    ours = _records(out)
    theirs = _trl_losses(family, checkpoint, tmp_path, _pairs(family, with_margin=True), center=0.01)
    assert [r["step"] for r in ours] == list(range(1, NUM_STEPS + 1))
    assert len(theirs) == NUM_STEPS
    diffs = {}
    for name in ("loss", "accuracy", "margin", "mean_reward"):
        diffs[name] = max(abs(a[name] - b[name]) for a, b in zip(ours, theirs))
    print("max abs diff vs TRL:", diffs)
    for a, b in zip(ours, theirs):
        print("STEP", {k: (a[k], b[k]) for k in ("loss", "accuracy", "margin", "mean_reward")})
    assert max(diffs.values()) < 1e-5, (diffs, ours, theirs)
    assert ours[0]["loss"] != pytest.approx(ours[-1]["loss"], abs=1e-3)  # the model did change


def _tune_rewards(family: str, step_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    """The rewards of ``tokens`` [n, s] (right padded) by tune's classifier read back from ``step_dir``."""
    from tune import training
    from tune.models import classifier_model

    spec = assets.FAMILIES[family]
    builder = getattr(__import__(f"tune.models.{spec.builder_module}", fromlist=[spec.builder]), spec.builder)
    model = classifier_model(builder(**assets.tune_dims(family)), num_classes=1)
    checkpointer = training.FullModelHFCheckpointer(
        step_dir, checkpoint_files=None, model_type="REWARD", output_dir=step_dir.parent / "read_back"
    )
    model.load_state_dict(checkpointer.load_checkpoint()[training.MODEL_KEY])
    with torch.no_grad():
        scores = model(tokens)
    last = training.get_unmasked_sequence_lengths(tokens == PAD_ID)
    return scores[torch.arange(len(tokens)), last, 0]


def _padded_batch(family: str) -> torch.Tensor:
    from tune.data import padded_collate_dpo

    tokens, _, _ = padded_collate_dpo(_pairs(family, num_pairs=4, seed=7, with_margin=True), padding_idx=PAD_ID)
    return tokens


@pytest.mark.parametrize("family", ["llama3_2", "qwen2_5"])
def test_lora_from_causal_lm_loads_in_transformers_and_peft(tmp_path, family):
    """LoRA from a causal LM: the output is a <Family>ForSequenceClassification checkpoint (num_labels 1,
    pad_token_id, score.weight) whose rewards in transformers equal the recipe model's; the PEFT SEQ_CLS adapter
    on the causal base gives them too."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    checkpoint = _write_checkpoint(family, tmp_path / "hf", classifier=False)
    out = tmp_path / "run"
    config = _write_config(tmp_path, family, checkpoint, out, lora=True, max_steps_per_epoch=2)
    run_recipe(RECIPE, config, [], cwd=tmp_path)
    final = out / "step_2"
    hf_config = json.loads((final / "config.json").read_text())
    assert hf_config["architectures"][0].endswith("ForSequenceClassification")
    assert hf_config["pad_token_id"] == PAD_ID and len(hf_config["id2label"]) == 1
    tokens = _padded_batch(family)
    ours = _tune_rewards(family, final, tokens)
    merged = AutoModelForSequenceClassification.from_pretrained(final, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = merged(tokens, attention_mask=(tokens != PAD_ID).long()).logits[:, 0]
    diff = (ours - theirs).abs().max().item()
    adapter_config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["task_type"] == "SEQ_CLS" and adapter_config["modules_to_save"] == ["score"]
    base = AutoModelForSequenceClassification.from_pretrained(
        checkpoint, num_labels=1, pad_token_id=PAD_ID, dtype=torch.float32
    )
    peft_model = PeftModel.from_pretrained(base, final / "adapter").eval()
    with torch.no_grad():
        peft_rewards = peft_model(input_ids=tokens, attention_mask=(tokens != PAD_ID).long()).logits[:, 0]
    peft_diff = (ours - peft_rewards).abs().max().item()
    print(f"{family}: rewards tune vs transformers {diff:.2e}, vs PEFT {peft_diff:.2e}")
    assert diff < 1e-5 and peft_diff < 1e-5


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path):
    """LoRA from a causal LM, saved every 2 steps: resumed from step 2, the run logs the uninterrupted run's losses
    and ends with its weights (the score head comes back from the PEFT adapter)."""
    family = "qwen3"
    checkpoint = _write_checkpoint(family, tmp_path / "hf", classifier=False)
    out = tmp_path / "run"
    config = _write_config(tmp_path, family, checkpoint, out, lora=True, save_every_n_steps=2)
    run_recipe(RECIPE, config, [], cwd=tmp_path)
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "logs")
    shutil.rmtree(resumed / f"step_{NUM_STEPS}")
    overrides = [f"output_dir={resumed}", f"checkpointer.output_dir={resumed}", f"metric_logger.log_dir={resumed}/logs"]
    overrides.append("resume_from_checkpoint=True")
    run_recipe(RECIPE, config, overrides, cwd=tmp_path)
    expected = {r["step"]: r["loss"] for r in _records(out)}
    got = {r["step"]: r["loss"] for r in _records(resumed)}
    assert sorted(got) == [3, 4]
    loss_diff = max(abs(got[s] - expected[s]) for s in got)
    tokens = _padded_batch(family)
    reward_diff = (
        (_tune_rewards(family, out / f"step_{NUM_STEPS}", tokens) - _tune_rewards(family, resumed / "step_4", tokens))
        .abs()
        .max()
        .item()
    )
    print(f"resume: max loss diff {loss_diff:.2e}, max reward diff {reward_diff:.2e}")
    assert loss_diff < 1e-6 and reward_diff < 1e-6


@pytest.mark.slow
def test_trained_reward_model_runs_in_ppo(tmp_path):
    """The full run's output is the reward (and value) model of ppo_full_finetune_single_device as it is, read with
    model_type: REWARD."""
    family = "llama3_2"
    causal = _write_checkpoint(family, tmp_path / "hf", classifier=False)
    out = tmp_path / "run"
    run_recipe(
        RECIPE, _write_config(tmp_path, family, causal, out, lora=False, max_steps_per_epoch=1), [], cwd=tmp_path
    )
    reward_dir = out / "step_1"
    ppo_out = tmp_path / "ppo"
    dims = assets.tune_dims(family)
    reward_model = [
        f"reward_and_value_model.{k}={json.dumps(v)}" for k, v in dims.items() if k != "tie_word_embeddings"
    ]
    policy = [f"policy_model.{k}={json.dumps(v)}" for k, v in dims.items()]
    overrides = [
        f"output_dir={ppo_out}",
        "device=cpu",
        "dtype=fp32",
        f"tokenizer.path={assets.tokenizer_file(assets.FAMILIES[family].tokenizer)}",
        "tokenizer.max_seq_len=64",
        "policy_model._component_=tune.models.llama3_2.llama3_2",
        *policy,
        "reward_and_value_model._component_=tune.models.llama3_2.llama3_2_classifier",
        *reward_model,
        *(f"{name}.checkpoint_dir={causal}" for name in ("checkpointer", "ref_policy_checkpointer")),
        *(f"{name}.checkpoint_dir={reward_dir}" for name in ("value_checkpointer", "reward_checkpointer")),
        *(f"{name}.checkpoint_files=null" for name in ("value_checkpointer", "reward_checkpointer")),
        "dataset._component_=tune.datasets.text_completion_dataset",
        "dataset.source=json",
        f"dataset.data_files={_prompts(tmp_path)}",
        "dataset.column=prompt",
        "~dataset.split",
        "batch_size=2",
        "forward_batch_size=2",
        "ppo_batch_size=2",
        "gradient_accumulation_steps=1",
        "num_steps=2",
        "max_generated_tokens=4",
        "save_every_n_steps=null",
        "compile=False",
        "log_peak_memory_stats=False",
    ]
    run_recipe(
        "ppo_full_finetune_single_device", "llama3_2/1B_full_ppo_single_device", overrides, cwd=tmp_path, timeout=300
    )
    records = [r for r in read_jsonl(next((ppo_out / "logs").glob("*.jsonl"))) if "loss" in r]
    assert records and all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"prompt": f"say {word}"} for word in "one two three four five six".split()]))
    return path


@pytest.mark.slow
def test_held_out_pair_accuracy_rises(tmp_path):
    """On the generated number task (tests/recipes/_preference_assets.py), LoRA training lifts the held-out pair
    accuracy from its start."""
    from tests.recipes._preference_assets import write_preference_messages

    family = "llama3_2"
    checkpoint = _write_checkpoint(family, tmp_path / "hf", classifier=False)
    train = write_preference_messages(tmp_path / "train.json", num_pairs=128, seed=0)
    held_out = write_preference_messages(tmp_path / "val.json", num_pairs=64, seed=1)
    out = tmp_path / "run"
    dataset = {"_component_": "tune.datasets.preference_dataset", "source": "json", "split": "train"}
    tokenizer_builder = assets.FAMILIES[family].tokenizer_builder or "tune.models.llama3.llama3_tokenizer"
    config = _write_config(
        tmp_path,
        family,
        checkpoint,
        out,
        lora=True,
        max_steps_per_epoch=None,
        epochs=3,
        batch_size=8,
        run_val_every_n_steps=8,
        dataset={**dataset, "data_files": str(train)},
        dataset_val={**dataset, "data_files": str(held_out)},
        tokenizer={
            "_component_": tokenizer_builder,
            "path": str(assets.tokenizer_file("tiktoken")),
            "max_seq_len": 128,
        },
    )
    cfg = json.loads(config.read_text())
    cfg["optimizer"]["lr"] = 3e-3
    cfg["loss"]["center_rewards_coefficient"] = None
    config.write_text(json.dumps(cfg))
    # validated every 8 steps: the first value is close to the untrained model's (chance), the last after 3 epochs
    run_recipe(RECIPE, config, [], cwd=tmp_path, timeout=600)
    (log,) = (out / "logs").glob("*.jsonl")
    curve = [r["val_accuracy"] for r in read_jsonl(log) if "val_accuracy" in r]
    print("held-out pair accuracy:", [round(a, 3) for a in curve])
    assert curve[-1] >= 0.65 and curve[-1] > curve[0] + 0.15


# the shipped configs, each run at tiny scale by the test below (tests/recipes/test_every_config.py reads this)
SHIPPED_CONFIGS: dict[str, tuple[str, str]] = {
    "llama3_2/1B_lora_reward_single_device.yaml": ("llama3_2", "lora"),
    "llama3_2/1B_full_reward_single_device.yaml": ("llama3_2", "full"),
    "qwen2_5/1.5B_lora_reward_single_device.yaml": ("qwen2_5", "lora"),
    "qwen3/1.7B_lora_reward_single_device.yaml": ("qwen3", "lora"),
    "gemma/2B_lora_reward_single_device.yaml": ("gemma", "lora"),
    "mistral/7B_lora_reward_single_device.yaml": ("mistral", "lora"),
}


@pytest.mark.slow
@pytest.mark.parametrize("relative", sorted(SHIPPED_CONFIGS))
def test_shipped_config_trains_and_loads_in_transformers(family_assets, tmp_path, relative):  # noqa: F811
    """Each shipped config at tiny scale (the family's tiny checkpoint and tokenizer, the generated pairs as train
    and held-out data, the config's LoRA settings, optimizer and schedule kept): 4 steps with a validation, and the
    output loads as AutoModelForSequenceClassification."""
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
        "batch_size=2",
        "gradient_accumulation_steps=1",
        f"max_steps_per_epoch={NUM_STEPS}",
        f"run_val_every_n_steps={NUM_STEPS}",
        "max_validation_steps=2",
        "optimizer.fused=False",
        "enable_activation_checkpointing=False",
    ]
    if spec.tokenizer_builder:
        overrides.append(f"tokenizer._component_={spec.tokenizer_builder}")
    run_recipe(RECIPE, CONFIGS / relative, overrides, cwd=tmp_path, timeout=300)
    (log,) = (out / "logs").glob("*.jsonl")
    records = read_jsonl(log)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, NUM_STEPS + 1))
    assert any("val_accuracy" in r for r in records)
    model = AutoModelForSequenceClassification.from_pretrained(out / f"step_{NUM_STEPS}", dtype=torch.float32)
    assert model.score.weight.shape[0] == 1


def test_preference_dataset_carries_the_margin_column(tmp_path):
    """preference_dataset(margin_column=...) gives each pair a ``margin`` that padded_collate_dpo batches."""
    from tune.data import padded_collate_dpo
    from tune.datasets import preference_dataset
    from tune.models.llama3 import llama3_tokenizer

    user = {"role": "user", "content": "one two"}
    rows = [
        {
            "chosen": [user, {"role": "assistant", "content": "three"}],
            "rejected": [user, {"role": "assistant", "content": "five"}],
            "gap": gap,
        }
        for gap in (0.5, 2.0)
    ]
    (tmp_path / "pairs.json").write_text(json.dumps(rows))
    tokenizer = llama3_tokenizer(str(assets.tokenizer_file("tiktoken")))
    data = preference_dataset(
        tokenizer, source="json", data_files=str(tmp_path / "pairs.json"), split="train", margin_column="gap"
    )
    assert [data[i]["margin"] for i in range(2)] == [0.5, 2.0]
    *_, margins = padded_collate_dpo([data[0], data[1]], padding_idx=tokenizer.pad_id)
    assert margins.tolist() == [0.5, 2.0] and margins.dtype == torch.float32
