"""ORPO (tune.rlhf.loss.ORPOLoss) through the preference recipes: `tune run` on the tiny Llama of
tests/recipes/utils.py.

The reference is TRL 1.16's ``ORPOTrainer`` (trl.experimental.orpo) on the same rows: the word-level tokenizer of
tests/recipes/test_lora_dpo_single_device.py turns generated preference rows (tests/recipes/_preference_assets.py)
into token ids, tokenised here as TRL's ``tokenize_row`` does (BOS, the prompt, the completion, EOS; labels on the
completion) and checked against TRL's own tokenisation of the training set; the recipe reads them through
tests/recipes/assets/dpo_components.py. Both start from the same PEFT adapter and are set to the same settings: fp32,
no shuffling, constant LR, AdamW, no clipping (a max norm no gradient reaches), batches of 2 pairs of unequal lengths.
TRL's NLL is the cross-entropy over every non-padding token of the chosen sequences of the batch: with one micro-batch
per step on one device, the recipes' NLL per chosen token of the step. TRL's ``logits/*`` average the logits over every
position of the padded batch (prompt and padding included), the recipes' over the completion tokens: not compared.

N ranks with batch b train as one device with batch N*b (the NLL is averaged over the chosen tokens of all ranks):
full_dpo_distributed on 2 gloo ranks is compared with one plain process, lora_dpo_distributed on 2 ranks with
lora_dpo_single_device (the slow tier).
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.test_lora_dpo_single_device import HF_TARGETS, _rows, _word_tokenizer
from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "lora_dpo_single_device"
CONFIG = ASSETS / "lora_dpo_tiny.yaml"
FULL_CONFIG = ASSETS / "full_dpo_tiny.yaml"
ORPO = "loss._component_=tune.rlhf.loss.ORPOLoss"
BATCH_SIZE, NUM_STEPS, LR, BETA = 2, 4, 1e-2, 0.1
METRICS = [
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
    "nll_loss", "log_odds_ratio", "log_odds_chosen",
]  # fmt: skip


def _orpo_token_pairs(tokenizer, rows: list[dict]) -> list[dict]:
    """Each row as TRL's ORPO trainer tokenises it: BOS + prompt, then the completion and EOS; labels -100 on the
    prompt."""
    pairs = []
    for row in rows:
        prompt = [tokenizer.bos_token_id, *tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]]
        pair = {}
        for side in ("chosen", "rejected"):
            full = tokenizer(row["prompt"] + row[side], add_special_tokens=False)["input_ids"]
            ids = [*prompt, *full[len(prompt) - 1 :], tokenizer.eos_token_id]
            assert tokenizer.unk_token_id not in ids
            pair[f"{side}_input_ids"] = ids
            pair[f"{side}_labels"] = [-100] * len(prompt) + ids[len(prompt) :]
        pairs.append(pair)
    return pairs


def _records(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def pairs(tiny_assets, tmp_path_factory):
    """The word-level tokenizer, the token-id pairs, a config reading them (ORPO, validated on 4 of them every 2
    steps), and the starting PEFT adapter (B = 0)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("orpo_pairs")
    tokenizer = _word_tokenizer()
    pairs_file = root / "pairs.json"
    pairs_file.write_text(json.dumps(_orpo_token_pairs(tokenizer, _rows())))
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["dataset"] = {"_component_": "dpo_components.token_pairs", "path": str(pairs_file)}
    cfg.update(dataset_val=cfg["dataset"], run_val_every_n_steps=2, max_validation_steps=2)
    cfg["loss"] = {"_component_": "tune.rlhf.loss.ORPOLoss", "beta": BETA}
    config_file = root / "orpo_tokens.yaml"
    config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=HF_TARGETS)
    get_peft_model(base, lora).save_pretrained(root / "adapter")
    return {"tokenizer": tokenizer, "config": config_file, "adapter": root / "adapter", "pairs_file": pairs_file}


def _overrides(assets: Path, out: Path, adapter: Path, *extra: str) -> list[str]:
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"checkpointer.adapter_checkpoint={adapter}",
        f"batch_size={BATCH_SIZE}",
        f"max_steps_per_epoch={NUM_STEPS}",
        f"optimizer.lr={LR}",
        *extra,
    ]


@pytest.fixture(scope="module")
def recipe_run(tiny_assets, pairs, tmp_path_factory):
    """lora_dpo_single_device with ORPO on the token pairs: 4 steps, checkpoints after steps 2 and 4; also asked to
    precompute reference log-probs (which ORPO has none of)."""
    root = tmp_path_factory.mktemp("orpo_run")
    out = root / "run"
    overrides = _overrides(tiny_assets, out, pairs["adapter"], "save_every_n_steps=2", "precompute_ref_log_probs=True")
    proc = run_recipe(RECIPE, pairs["config"], overrides, cwd=root)
    return {"out": out, "output": proc.stdout + proc.stderr}


def _trl_orpo(assets: Path, adapter: Path, tokenizer, pairs_file: Path, out: Path) -> tuple[list[float], list[dict]]:
    """TRL's ORPOTrainer on the same rows: per-step losses and logged metrics (its tokenisation checked against the
    recipe's token ids)."""
    from datasets import Dataset
    from peft import PeftModel
    from torch.utils.data import SequentialSampler
    from transformers import LlamaForCausalLM
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    losses = []

    class InOrder(ORPOTrainer):
        def _get_train_sampler(self, train_dataset=None):  # the recipe with shuffle: False
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    base = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    args = ORPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=1,
        max_steps=NUM_STEPS,
        learning_rate=LR,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=1e9,  # computed and logged, never reached: no clipping, as the recipe's clip_grad_norm: null
        optim="adamw_torch",
        beta=BETA,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_dropout=True,
        dataloader_drop_last=True,
    )
    trainer = InOrder(model=model, args=args, train_dataset=Dataset.from_list(_rows()), processing_class=tokenizer)
    ours = json.loads(pairs_file.read_text())
    for row, pair in zip(trainer.train_dataset, ours, strict=True):  # the same tokens, the same labels
        for key in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"):
            assert list(row[key]) == pair[key], key
    trainer.train()
    return losses, [h for h in trainer.state.log_history if "loss" in h]


def test_steps_equal_trl_orpo_trainer(tiny_assets, pairs, recipe_run, tmp_path):
    trl_losses, trl_logs = _trl_orpo(
        tiny_assets, pairs["adapter"], pairs["tokenizer"], pairs["pairs_file"], tmp_path / "trl"
    )
    records = _records(recipe_run["out"])
    assert len(trl_losses) == len(trl_logs) == NUM_STEPS
    worst = {}
    for step, (trl_loss, trl_log) in enumerate(zip(trl_losses, trl_logs), start=1):
        ours = records[step]
        worst["loss"] = max(worst.get("loss", 0.0), abs(ours["loss"] - trl_loss))
        for key in [*METRICS, "grad_norm"]:
            worst[key] = max(worst.get(key, 0.0), abs(ours[key] - trl_log[key]))
        print(f"step {step}: recipe loss {ours['loss']:.7f}  TRL {trl_loss:.7f}  nll {ours['nll_loss']:.6f}")
    print("max |recipe - TRL| over the steps:", {k: f"{v:.1e}" for k, v in worst.items()})
    assert worst["loss"] < 1e-5
    for key in METRICS:
        assert worst[key] < 1e-5, key
    assert worst["grad_norm"] < 1e-4 * max(r["grad_norm"] for r in records.values())
    assert records[NUM_STEPS]["loss"] < records[1]["loss"]  # it trained
    # no reference model: asking to precompute its log-probs is said to have no effect
    assert "precompute_ref_log_probs has no effect: tune.rlhf.loss.ORPOLoss" in recipe_run["output"]
    validation = [r for r in read_jsonl(recipe_run["out"] / "logs" / "log.jsonl") if "val_loss" in r]
    assert [r["step"] for r in validation] == [2, 4]
    for record in validation:  # the validation loss is the odds-ratio term plus the NLL
        assert record["val_loss"] == pytest.approx(record["val_nll_loss"] - BETA * record["val_log_odds_ratio"])


def test_resume_equals_the_uninterrupted_run_and_the_adapter_loads_in_peft(tiny_assets, pairs, recipe_run, tmp_path):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    uninterrupted_dir = recipe_run["out"]
    out = tmp_path / "resumed"
    shutil.copytree(uninterrupted_dir, out)  # a crash after step 2: later checkpoints and the log gone
    shutil.rmtree(out / "logs")
    shutil.rmtree(out / f"step_{NUM_STEPS}")
    overrides = _overrides(tiny_assets, out, pairs["adapter"], "save_every_n_steps=2", "resume_from_checkpoint=True")
    run_recipe(RECIPE, pairs["config"], overrides, cwd=tmp_path)
    resumed, uninterrupted = _records(out), _records(uninterrupted_dir)
    assert sorted(resumed) == [3, 4]
    worst = max(abs(resumed[s][k] - uninterrupted[s][k]) for s in resumed for k in ("loss", *METRICS))
    print(f"resume: max |resumed - uninterrupted| over steps 3-4, loss and metrics: {worst:.1e}")
    assert worst <= 1e-6
    final = f"step_{NUM_STEPS}/adapter/adapter_model.safetensors"
    expected = load_file(uninterrupted_dir / final)
    for key, value in load_file(out / final).items():
        torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=0, msg=key)

    merged = LlamaForCausalLM.from_pretrained(uninterrupted_dir / f"step_{NUM_STEPS}", dtype=torch.float32).eval()
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokens = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        adapter = uninterrupted_dir / f"step_{NUM_STEPS}" / "adapter"
        peft_logits = PeftModel.from_pretrained(base, adapter).eval()(input_ids=tokens).logits
        merged_logits = merged(input_ids=tokens).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=1e-5)
    assert (peft_logits - base_logits).abs().max() > 1e-3


# --------------------------------------------------------------------------------------------- 2 ranks, 1 device


def _message_pairs(root: Path) -> dict[str, Path]:
    return {
        "train": write_preference_messages(root / "pairs.json", 16, seed=0),
        "held_out": write_preference_messages(root / "held_out.json", 6, seed=1),
    }


def _messages_overrides(assets: Path, data: dict, out: Path, *extra: str) -> list[str]:
    node = "{_component_: tune.datasets.preference_dataset, source: json, split: train, data_files: %s}"
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"dataset.data_files={data['train']}",
        f"dataset_val={node % data['held_out']}",
        "run_val_every_n_steps=2",
        "max_steps_per_epoch=3",
        "shuffle=True",
        ORPO,
        *extra,
    ]


def _compare(one: dict, two: dict, label: str) -> float:
    keys = ["loss", *METRICS, "logits/chosen", "logits/rejected", "val_loss", "val_nll_loss", "val_log_odds_ratio"]
    worst = {key: max_difference(one, two, key) for key in keys}
    print(f"{label}: max |2 ranks - 1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return max(worst.values())


@pytest.mark.slow
def test_lora_two_ranks_equal_one_device(tiny_assets, tmp_path):
    """lora_dpo_distributed with ORPO: 2 ranks x 1 pair x 2 accumulation steps equal lora_dpo_single_device with
    4 pairs per step (prompts of unequal lengths: a per-rank or per-micro-batch NLL mean would differ)."""
    from tests.recipes.utils import random_peft_adapter

    data = _message_pairs(tmp_path)
    adapter = random_peft_adapter(tiny_assets, tmp_path / "adapter")
    one, two = tmp_path / "one", tmp_path / "two"
    common = [f"checkpointer.adapter_checkpoint={adapter}", "optimizer.lr=1e-2"]
    run_concurrently(
        lambda: run_recipe(
            RECIPE, CONFIG, _messages_overrides(tiny_assets, data, one, *common, "batch_size=4"), tmp_path
        ),
        lambda: run_distributed(
            "lora_dpo_distributed",
            CONFIG,
            _messages_overrides(tiny_assets, data, two, *common, "batch_size=1", "gradient_accumulation_steps=2"),
            tmp_path,
        ),
    )
    assert _compare(train_log(one), train_log(two), "LoRA ORPO") < 1e-5
    assert train_log(two)[3]["nll_loss"] > 0


def test_full_two_ranks_equal_one_process_and_load_in_transformers(tiny_assets, tmp_path):
    """full_dpo_distributed with ORPO (no reference model): 2 ranks x 2 pairs equal one plain process (no torchrun:
    the full fine-tuning path on one device) with 4 pairs per step; the output loads in transformers."""
    from transformers import LlamaForCausalLM

    data = _message_pairs(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    common = ["ref_checkpointer=null", "optimizer.lr=1e-3"]
    one_process = ["~ref_checkpointer", "optimizer.lr=1e-3"]  # a reference-free loss needs no ref_checkpointer key
    run_concurrently(
        lambda: run_recipe(
            "full_dpo_distributed",
            FULL_CONFIG,
            _messages_overrides(tiny_assets, data, one, *one_process, "batch_size=4"),
            tmp_path,
            timeout=300,
        ),  # fmt: skip
        lambda: run_distributed(
            "full_dpo_distributed",
            FULL_CONFIG,
            _messages_overrides(tiny_assets, data, two, *common, "batch_size=2"),
            tmp_path,
        ),
    )
    assert _compare(train_log(one), train_log(two), "full ORPO") < 1e-5
    trained = LlamaForCausalLM.from_pretrained(two / "step_3", dtype=torch.float32).eval()
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokens = torch.randint(3, 320, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (trained(input_ids=tokens).logits - base(input_ids=tokens).logits).abs().max() > 1e-3
        assert torch.isfinite(trained(input_ids=tokens).logits).all()


# -------------------------------------------------------------------------------------------------- learning


def _mean_log_prob_accuracy(model, dataset) -> float:
    """The share of pairs whose chosen completion has the higher mean log-probability per token (ORPO's reward
    ranking), computed here by hand."""
    wins = 0
    for pair in dataset:
        scores = []
        for side in ("chosen", "rejected"):
            tokens, labels = torch.tensor([pair[f"{side}_input_ids"]]), torch.tensor(pair[f"{side}_labels"])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=tokens).logits[0, :-1], dim=-1)
            scored = labels[1:] != -100
            scores.append(log_probs[scored, labels[1:][scored]].mean().item())
        wins += scores[0] > scores[1]
    return wins / len(dataset)


@pytest.mark.slow
def test_orpo_learns_the_generated_preference(tiny_assets, tmp_path):
    """On held-out pairs of the generated task the reward accuracy (chosen mean log-prob above the rejected one)
    rises from the starting model's to near 1, and the NLL of the chosen sequences falls."""
    from transformers import LlamaForCausalLM

    from tune.datasets import preference_dataset
    from tune.models.llama2 import llama2_tokenizer

    train = write_preference_messages(tmp_path / "train.json", 192, seed=0)
    held_out = write_preference_messages(tmp_path / "held_out.json", 48, seed=1)
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}", f"output_dir={out}", f"dataset.data_files={train}", "batch_size=8",
        "epochs=2", "max_steps_per_epoch=null", "optimizer.lr=3e-3", "shuffle=True", ORPO,
        "dataset_val={_component_: tune.datasets.preference_dataset, source: json, split: train, "
        f"data_files: {held_out}}}",
        "run_val_every_n_steps=8",
    ]  # fmt: skip
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path, timeout=600)
    records = read_jsonl(out / "logs" / "log.jsonl")
    validation = [r for r in records if "val_loss" in r]
    tokenizer = llama2_tokenizer(str(tiny_assets / "tokenizer.model"), max_seq_len=256, prompt_template=None)
    pairs = preference_dataset(tokenizer, source="json", data_files=str(held_out), split="train")
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    start = _mean_log_prob_accuracy(base, pairs)
    curve = [round(r["val_rewards/accuracies"], 3) for r in validation]
    nll = [round(r["val_nll_loss"], 3) for r in validation]
    print(f"held-out reward accuracy: start {start:.3f}, then every 8 steps {curve}; held-out NLL {nll}")
    assert curve[-1] >= start + 0.25 and curve[-1] >= 0.8
    assert nll[-1] < nll[0] and all(math.isfinite(v) for v in nll)


@pytest.mark.slow
def test_full_two_context_parallel_ranks_equal_one_process(tiny_assets, tmp_path):
    """full_dpo_distributed with ORPO and context_parallel_dim=2 (each rank holds half of every sequence; the NLL
    and log-probability sums are added over the pair of ranks) equals one process, 2 micro-batches of 2 pairs
    against 4 pairs at once."""
    data = _message_pairs(tmp_path)
    one, cp = tmp_path / "one", tmp_path / "cp2"
    common = ["ref_checkpointer=null", "optimizer.lr=1e-3"]
    cp_extra = ["batch_size=2", "gradient_accumulation_steps=2", "context_parallel_dim=2"]
    _, proc = run_concurrently(
        lambda: run_recipe(
            "full_dpo_distributed",
            FULL_CONFIG,
            _messages_overrides(tiny_assets, data, one, *common, "batch_size=4"),
            tmp_path,
            timeout=300,
        ),  # fmt: skip
        lambda: run_distributed(
            "full_dpo_distributed",
            FULL_CONFIG,
            _messages_overrides(tiny_assets, data, cp, *common, *cp_extra),
            tmp_path,
        ),
    )
    assert "1 data-parallel shard(s) x 2 context-parallel" in proc.stderr
    assert _compare(train_log(one), train_log(cp), "full ORPO, context parallel") < 1e-5
