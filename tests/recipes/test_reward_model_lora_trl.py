"""reward_model_single_device with LoRA against TRL's RewardTrainer with a PEFT LoRA, step by step.

Both start from the same weights: a tiny Llama sequence classifier and a PEFT ``SEQ_CLS`` adapter (random A and B,
so the adapter changes the rewards from step 1, and the score head in ``modules_to_save``) that the recipe reads
through ``checkpointer.adapter_checkpoint`` and TRL through ``PeftModel.from_pretrained``. Expected numbers come
from the reference run in the test (TRL 1.16, PEFT 0.21).
"""

from pathlib import Path

import torch

from tests.recipes.test_reward_model_single_device import (
    NUM_STEPS,
    RECIPE,
    _pairs,
    _records,
    _write_checkpoint,
    _write_config,
)
from tests.recipes.utils import run_recipe

FAMILY = "llama3_2"
# tune's LoRA of the test config (tests/recipes/test_reward_model_single_device.py): q, v and the MLP, rank 4
TARGETS = ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]


def _write_adapter(checkpoint: Path, where: Path) -> Path:
    """A PEFT SEQ_CLS adapter on the checkpoint with every LoRA matrix random (PEFT starts B at zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32)
    lora = LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, modules_to_save=["score"]
    )
    model = get_peft_model(model, lora)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                parameter.normal_(0.0, 0.1)
    model.save_pretrained(where)
    return where


def _trl_records(checkpoint: Path, adapter: Path, tmp_path: Path) -> list[dict]:
    from datasets import Dataset
    from peft import PeftModel
    from tokenizers import Tokenizer, models
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast
    from trl import RewardConfig, RewardTrainer

    from tests.recipes import _family_assets as assets

    vocab = {f"t{i}": i for i in range(assets.vocab_size(FAMILY))}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")), pad_token="t0", eos_token="t1"
    )

    class SequentialRewardTrainer(RewardTrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    base = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    rows = _pairs(FAMILY, with_margin=True)
    data = Dataset.from_list(
        [
            {"chosen_ids": r["chosen_input_ids"], "rejected_ids": r["rejected_input_ids"], "margin": r["margin"]}
            for r in rows
        ]
    )
    args = RewardConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1e9,  # no clipping, as the recipe's clip_grad_norm: null
        max_steps=NUM_STEPS,
        logging_steps=1,
        optim="adamw_torch",
        center_rewards_coefficient=0.01,
        gradient_checkpointing=False,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        dataloader_drop_last=True,
    )
    trainer = SequentialRewardTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]


def test_lora_matches_trl_reward_trainer_with_peft(tmp_path):
    """4 steps of 2 pairs (unequal lengths, right padding, margins, reward centering), LoRA on q, v and the MLP plus
    the trained score head: tune's losses and metrics are TRL's within 1e-5."""
    checkpoint = _write_checkpoint(FAMILY, tmp_path / "hf", classifier=True)
    adapter = _write_adapter(checkpoint, tmp_path / "adapter")
    out = tmp_path / "run"
    config = _write_config(tmp_path, FAMILY, checkpoint, out, lora=True)
    run_recipe(RECIPE, config, [f"checkpointer.adapter_checkpoint={adapter}"], cwd=tmp_path)
    ours = _records(out)
    theirs = _trl_records(checkpoint, adapter, tmp_path)
    assert [r["step"] for r in ours] == list(range(1, NUM_STEPS + 1)) and len(theirs) == NUM_STEPS
    diffs = {
        name: max(abs(a[name] - b[name]) for a, b in zip(ours, theirs))
        for name in ("loss", "accuracy", "margin", "mean_reward")
    }
    print("LoRA reward model, max abs diff vs TRL + PEFT:", diffs)
    assert max(diffs.values()) < 1e-5, (diffs, ours, theirs)
    assert abs(ours[0]["loss"] - ours[-1]["loss"]) > 1e-3  # the adapters and the head did train
