"""Integration tests of recipes/kto_single_device.py: `tune run` on the tiny Llama of tests/recipes/utils.py.

The reference is TRL 1.16's ``KTOTrainer`` on the same examples: a word-level tokenizer turns generated preference
pairs (tests/recipes/_preference_assets.py), unpaired into desirable and undesirable examples, into the token ids
both trainers see (the recipe reads them through tests/recipes/assets/kto_components.py, whose KL rows come from
``tune.datasets.UnpairedPreferenceDataset``). TRL is set to the recipe's settings: fp32, sequential sampling (TRL
requires it with the KL term), constant LR, no clipping, batches of 4 (TRL's KL groups; the recipe's
``kl_group_size: 4``). LoRA starts from the same PEFT adapter (B = 0: policy == reference at step 1); full
fine-tuning from the same checkpoint, with a frozen copy as the reference.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes._preference_assets import preference_rows
from tests.recipes.test_lora_dpo_single_device import HF_TARGETS, _word_tokenizer
from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "kto_single_device"
CONFIG = ASSETS / "kto_tiny.yaml"
NUM_PAIRS, BATCH_SIZE, NUM_STEPS, LR, BETA = 10, 4, 4, 1e-2, 0.1
DESIRABLE_WEIGHT, UNDESIRABLE_WEIGHT = 1.0, 0.5  # the KL estimate is positive (not clamped) at steps 3 and 4
METRICS = [
    "kl", "rewards/chosen", "rewards/rejected", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip
FULL = ["model._component_=tune.models.llama2.llama2"] + [
    f"~model.{key}" for key in ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
                                "lora_alpha", "lora_dropout")
]  # fmt: skip


def _unpaired_rows() -> list[dict]:
    """TRL's unpaired format, in blocks of 2 pairs (chosen, chosen, rejected, rejected): every batch of 4 holds both
    kinds and its KL rotation pairs each prompt with another prompt's completion. Completions start with a space:
    TRL concatenates prompt and completion as strings."""
    pairs = preference_rows(NUM_PAIRS, 0)
    rows = []
    for start in range(0, NUM_PAIRS, 2):
        block = pairs[start : start + 2]
        rows += [{"prompt": p["prompt"], "completion": " " + p["chosen"], "label": True} for p in block]
        rows += [{"prompt": p["prompt"], "completion": " " + p["rejected"], "label": False} for p in block]
    return rows


def _token_examples(tokenizer, rows: list[dict]) -> list[dict]:
    """Each row as TRL tokenises it: the prompt, then prompt + completion + EOS; labels -100 on the prompt."""
    examples = []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        ids = tokenizer(row["prompt"] + row["completion"] + tokenizer.eos_token)["input_ids"]
        assert ids[: len(prompt)] == prompt and tokenizer.unk_token_id not in ids
        examples.append({"input_ids": ids, "labels": [-100] * len(prompt) + ids[len(prompt) :], "label": row["label"]})
    return examples


def _records(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def examples(tiny_assets, tmp_path_factory):
    """The word-level tokenizer, a config reading the token-id examples, and the starting PEFT adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("kto_examples")
    tokenizer = _word_tokenizer()
    examples_file = root / "examples.json"
    examples_file.write_text(json.dumps(_token_examples(tokenizer, _unpaired_rows())))
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["dataset"] = {
        "_component_": "kto_components.token_examples", "path": str(examples_file), "kl_group_size": BATCH_SIZE
    }  # fmt: skip
    cfg.update(dataset_val=cfg["dataset"], run_val_every_n_steps=2, max_validation_steps=1)
    config = root / "kto_tokens.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=HF_TARGETS)  # B = 0: adds nothing yet
    get_peft_model(base, lora).save_pretrained(root / "adapter")
    return {"tokenizer": tokenizer, "config": config, "adapter": root / "adapter"}


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"assets_dir={assets}", f"output_dir={out}", f"batch_size={BATCH_SIZE}", f"max_steps_per_epoch={NUM_STEPS}",
        f"optimizer.lr={LR}", f"loss.beta={BETA}", f"loss.desirable_weight={DESIRABLE_WEIGHT}",
        f"loss.undesirable_weight={UNDESIRABLE_WEIGHT}", "save_every_n_steps=2", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tiny_assets, examples, tmp_path_factory):
    """The LoRA recipe on the token examples: 4 steps, checkpoints after steps 2 and 4."""
    root = tmp_path_factory.mktemp("kto_run")
    out = root / "run"
    run_recipe(
        RECIPE,
        examples["config"],
        _overrides(tiny_assets, out, f"checkpointer.adapter_checkpoint={examples['adapter']}"),
        cwd=root,
    )
    return out


def _trl_run(assets: Path, tokenizer, out: Path, adapter: Path | None) -> tuple[list[float], list[dict]]:
    """TRL's KTOTrainer on the same rows: per-step losses and logged metrics."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import LlamaForCausalLM
    from trl import KTOConfig
    from trl.trainer.kto_trainer import KTOTrainer

    losses = []

    class Recorded(KTOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    model = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    ref_model = None
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    else:
        ref_model = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    args = KTOConfig(
        output_dir=str(out), per_device_train_batch_size=BATCH_SIZE, gradient_accumulation_steps=1,
        max_steps=NUM_STEPS, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_grad_norm=1e9,  # computed and logged, never reached: no clipping, as the recipe's clip_grad_norm: null
        optim="adamw_torch", beta=BETA, desirable_weight=DESIRABLE_WEIGHT, undesirable_weight=UNDESIRABLE_WEIGHT,
        loss_type="kto", bf16=False, fp16=False, use_cpu=True, seed=0, logging_steps=1, save_strategy="no",
        report_to=[], disable_dropout=True, dataloader_drop_last=True, train_sampling_strategy="sequential",
        max_length=None,
    )  # fmt: skip
    trainer = Recorded(
        model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(_unpaired_rows()),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    return losses, [h for h in trainer.state.log_history if "loss" in h]


def _compare_with_trl(records: dict[int, dict], trl_losses: list[float], trl_logs: list[dict]) -> dict[str, float]:
    assert len(trl_losses) == len(trl_logs) == NUM_STEPS
    worst = {}
    for step, (trl_loss, trl_log) in enumerate(zip(trl_losses, trl_logs), start=1):
        ours = records[step]
        worst["loss"] = max(worst.get("loss", 0.0), abs(ours["loss"] - trl_loss))
        for key in METRICS:
            worst[key] = max(worst.get(key, 0.0), abs(ours[key] - trl_log[key]))
        print(
            f"step {step}: recipe loss {ours['loss']:.7f} TRL {trl_loss:.7f}; kl {ours['kl']:.6f} {trl_log['kl']:.6f}"
        )
    print("max |recipe - TRL| over the steps:", {k: f"{v:.1e}" for k, v in worst.items()})
    assert worst["loss"] < 1e-5
    for key in METRICS:
        assert worst[key] < 1e-5 * max(1.0, max(abs(r[key]) for r in records.values())), key
    assert records[NUM_STEPS]["rewards/margins"] != 0 and records[NUM_STEPS]["kl"] > 0  # the run moved
    return worst


def test_lora_steps_equal_trl_kto_trainer(tiny_assets, examples, lora_run, tmp_path):
    records = _records(lora_run)
    assert records[1]["loss"] == pytest.approx((DESIRABLE_WEIGHT + UNDESIRABLE_WEIGHT) / 4, abs=1e-6)  # sigmoid(0)
    trl_losses, trl_logs = _trl_run(tiny_assets, examples["tokenizer"], tmp_path / "trl", examples["adapter"])
    _compare_with_trl(records, trl_losses, trl_logs)
    validation = [r for r in read_jsonl(lora_run / "logs" / "log.jsonl") if "val_loss" in r]
    assert [r["step"] for r in validation] == [2, 4]
    assert all(0 <= r["val_desirable_rate"] <= 1 and math.isfinite(r["val_kl"]) for r in validation)


def test_lora_outputs_load_in_transformers_and_peft(tiny_assets, lora_run):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = lora_run / f"step_{NUM_STEPS}"
    merged = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokens = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        peft_logits = PeftModel.from_pretrained(base, final / "adapter").eval()(input_ids=tokens).logits
        merged_logits = merged(input_ids=tokens).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=1e-5)
    assert (peft_logits - base_logits).abs().max() > 1e-3  # the adapter learned something to compare


def _check_resume(assets: Path, config: Path, run: Path, tmp_path: Path, extra: list[str], weights: str) -> float:
    """A crash after step 2 (later checkpoint and the log gone), resumed: the uninterrupted run's losses, metrics
    and final weights."""
    out = tmp_path / "resumed"
    shutil.copytree(run, out)
    shutil.rmtree(out / "logs")
    shutil.rmtree(out / f"step_{NUM_STEPS}")
    run_recipe(RECIPE, config, _overrides(assets, out, *extra, "resume_from_checkpoint=True"), cwd=tmp_path)
    resumed, uninterrupted = _records(out), _records(run)
    assert sorted(resumed) == [3, 4]
    worst = 0.0
    for step, record in resumed.items():
        for key in ("loss", *METRICS):
            worst = max(worst, abs(record[key] - uninterrupted[step][key]))
            assert record[key] == pytest.approx(uninterrupted[step][key], abs=1e-6, rel=0), (step, key)
    expected = load_file(run / f"step_{NUM_STEPS}" / weights)
    for key, value in load_file(out / f"step_{NUM_STEPS}" / weights).items():
        torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=0, msg=key)
    print(f"resumed vs uninterrupted: max |difference| of losses and metrics {worst:.1e}")
    return worst


def test_lora_resume_equals_the_uninterrupted_run(tiny_assets, examples, lora_run, tmp_path):
    adapter = f"checkpointer.adapter_checkpoint={examples['adapter']}"
    _check_resume(tiny_assets, examples["config"], lora_run, tmp_path, [adapter], "adapter/adapter_model.safetensors")


@pytest.mark.slow
def test_full_fine_tune_equals_trl_and_resumes(tiny_assets, examples, tmp_path):
    """Without adapters the recipe trains every weight against a frozen copy of the starting ones: TRL's KTOTrainer
    with a ref_model; resumed after step 2, the reference is read from the starting checkpoint again."""
    out = tmp_path / "full"
    proc = run_recipe(RECIPE, examples["config"], _overrides(tiny_assets, out, *FULL), cwd=tmp_path)
    assert "Reference: a frozen copy of the starting weights" in proc.stdout + proc.stderr
    trl_losses, trl_logs = _trl_run(tiny_assets, examples["tokenizer"], tmp_path / "trl", None)
    _compare_with_trl(_records(out), trl_losses, trl_logs)
    _check_resume(tiny_assets, examples["config"], out, tmp_path, FULL, "model.safetensors")


@pytest.mark.slow
def test_kto_learns_the_generated_preference(tiny_assets, tmp_path):
    """On held-out examples of the generated task (pairs read as unpaired examples), the held-out desirable rate
    (the share of same-prompt comparisons in which the policy finds the desirable completion more likely) rises
    well above the starting model's."""
    from transformers import LlamaForCausalLM

    from tests.recipes._preference_assets import write_preference_messages
    from tests.recipes.test_lora_dpo_single_device import _preference_accuracy
    from tune.datasets import preference_dataset
    from tune.models.llama2 import llama2_tokenizer

    train = write_preference_messages(tmp_path / "train.json", 192, seed=0)
    held_out = write_preference_messages(tmp_path / "held_out.json", 48, seed=1)
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}", f"output_dir={out}", f"dataset.data_files={train}", "batch_size=8",
        "dataset.kl_group_size=8", "epochs=2", "max_steps_per_epoch=null", "optimizer.lr=3e-3", "shuffle=True",
        "dataset_val={_component_: tune.datasets.unpaired_from_pairs, source: json, split: train, kl_group_size: 8, "
        f"data_files: {held_out}}}",
        "run_val_every_n_steps=24",
    ]  # fmt: skip
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path, timeout=900)
    validation = [r for r in read_jsonl(out / "logs" / "log.jsonl") if "val_loss" in r]

    tokenizer = llama2_tokenizer(str(tiny_assets / "tokenizer.model"), max_seq_len=256, prompt_template=None)
    pairs = preference_dataset(tokenizer, source="json", data_files=str(held_out), split="train")
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    before = _preference_accuracy(base, pairs)
    rates = [r["val_desirable_rate"] for r in validation]
    print(f"held-out desirable rate: {before:.3f} at the start, then {rates} (steps {[r['step'] for r in validation]})")
    assert rates[-1] >= before + 0.25 and rates[-1] >= 0.8
