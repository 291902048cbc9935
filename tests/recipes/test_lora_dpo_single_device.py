"""Integration tests of recipes/lora_dpo_single_device.py: `tune run` on the tiny Llama of tests/recipes/utils.py.

The reference is TRL 1.16's ``DPOTrainer`` on the same pairs: a word-level tokenizer built here turns generated
preference rows (tests/recipes/_preference_assets.py) into the token ids both trainers see (the recipe reads them
through tests/recipes/assets/dpo_components.py), both start from the same PEFT adapter (PEFT's default
initialisation: B = 0, so policy == reference at step 1), and TRL is set to the recipe's settings: fp32 (TRL picks
bf16 by default), no shuffling, constant LR, no clipping (a max norm no gradient reaches), batches of 2 pairs. TRL
appends EOS to each completion; the ids given to the recipe are TRL's own tokenisation, EOS included.
"""

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes._preference_assets import FILLER, NUMBERS, preference_rows, write_preference_messages
from tests.recipes.utils import ASSETS, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPE = "lora_dpo_single_device"
CONFIG = ASSETS / "lora_dpo_tiny.yaml"
NUM_PAIRS, BATCH_SIZE, NUM_STEPS, LR, BETA = 16, 2, 4, 1e-2, 0.1
# lora_dpo_tiny.yaml adapts q_proj, v_proj, output_proj and the MLP: their Hugging Face names
HF_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METRICS = [
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
    "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected",
]  # fmt: skip


def _word_tokenizer():
    """A word-level ``transformers`` tokenizer: ids 0-3 are <pad> <unk> <s> </s>, then one id per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<s>", "</s>", *dict.fromkeys([*"what number is after".split(), *NUMBERS, *FILLER])]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def _token_pairs(tokenizer, rows: list[dict]) -> list[dict]:
    """Each row as TRL tokenises it: the prompt, then prompt + completion + EOS; labels -100 on the prompt."""
    pairs = []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        pair = {}
        for side in ("chosen", "rejected"):
            ids = tokenizer(row["prompt"] + row[side] + tokenizer.eos_token)["input_ids"]
            assert ids[: len(prompt)] == prompt and tokenizer.unk_token_id not in ids
            pair[f"{side}_input_ids"] = ids
            pair[f"{side}_labels"] = [-100] * len(prompt) + ids[len(prompt) :]
        pairs.append(pair)
    return pairs


def _rows() -> list[dict]:
    # completions start with a space: TRL concatenates prompt and completion as strings
    return [
        {**row, "chosen": " " + row["chosen"], "rejected": " " + row["rejected"]}
        for row in preference_rows(NUM_PAIRS, 0)
    ]


def _config_with_token_pairs(path: Path, pairs_file: Path) -> Path:
    """lora_dpo_tiny.yaml with its dataset node replaced by the token-id pairs, validated on the first 4 of them
    every 2 steps."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["dataset"] = {"_component_": "dpo_components.token_pairs", "path": str(pairs_file)}
    cfg.update(dataset_val=cfg["dataset"], run_val_every_n_steps=2, max_validation_steps=2)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _records(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def pairs(tiny_assets, tmp_path_factory):
    """The word-level tokenizer, the token-id pairs file, a config reading it, and the starting PEFT adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("dpo_pairs")
    tokenizer = _word_tokenizer()
    pairs_file = root / "pairs.json"
    pairs_file.write_text(json.dumps(_token_pairs(tokenizer, _rows())))
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=HF_TARGETS)  # B = 0: adds nothing yet
    get_peft_model(base, config).save_pretrained(root / "adapter")
    return {
        "tokenizer": tokenizer,
        "config": _config_with_token_pairs(root / "dpo_tokens.yaml", pairs_file),
        "adapter": root / "adapter",
        "pairs_file": pairs_file,
    }


def _overrides(assets: Path, out: Path, adapter: Path, *extra: str) -> list[str]:
    return [
        f"assets_dir={assets}",
        f"output_dir={out}",
        f"checkpointer.adapter_checkpoint={adapter}",
        f"batch_size={BATCH_SIZE}",
        f"max_steps_per_epoch={NUM_STEPS}",
        f"optimizer.lr={LR}",
        f"loss.beta={BETA}",
        *extra,
    ]


@pytest.fixture(scope="module")
def recipe_run(tiny_assets, pairs, tmp_path_factory):
    """The recipe on the token pairs: 4 steps, checkpoints after steps 2 and 4."""
    root = tmp_path_factory.mktemp("dpo_run")
    out = root / "run"
    overrides = _overrides(tiny_assets, out, pairs["adapter"], "save_every_n_steps=2")
    run_recipe(RECIPE, pairs["config"], overrides, cwd=root)
    return out


def _trl_run(
    assets: Path, adapter: Path, tokenizer, out: Path, loss_type: str = "sigmoid", num_steps: int = NUM_STEPS
) -> tuple[list[float], list[dict]]:
    """TRL's DPOTrainer on the same rows: per-step losses and logged metrics."""
    from datasets import Dataset
    from peft import PeftModel
    from torch.utils.data import SequentialSampler
    from transformers import LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    losses = []

    class InOrder(DPOTrainer):
        def _get_train_sampler(self, train_dataset=None):  # the recipe with shuffle: False
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    base = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    args = DPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=1,
        max_steps=num_steps,
        learning_rate=LR,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=1e9,  # computed and logged, never reached: no clipping, as the recipe's clip_grad_norm: null
        optim="adamw_torch",
        beta=BETA,
        loss_type=[loss_type],
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
    trainer.train()
    return losses, [h for h in trainer.state.log_history if "loss" in h]


def test_step_one_is_ln2_with_zero_rewards(recipe_run):
    # policy == reference (the adapter's B is 0, and the reference is the model with adapters disabled)
    first = _records(recipe_run)[1]
    difference = abs(first["loss"] - math.log(2))
    print(f"step 1: loss {first['loss']:.9f}, ln 2 = {math.log(2):.9f}, |difference| {difference:.2e}")
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6, rel=0)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert first[key] == 0, key
    assert first["logps/chosen"] < 0 and first["logps/rejected"] < 0
    (validation,) = [r for r in read_jsonl(recipe_run / "logs" / "log.jsonl") if r["step"] == 2 and "val_loss" in r]
    assert validation["val_rewards/accuracies"] >= 0 and math.isfinite(validation["val_loss"])


def _hf_mean_log_probs(assets: Path, pairs_file: Path, num_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token mean log-probabilities of the first chosen and rejected completions under the tiny Llama in
    transformers, computed here by hand (log-softmax, gather, mean over the completion tokens)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32).eval()
    means = {"chosen": [], "rejected": []}
    for pair in json.loads(pairs_file.read_text())[:num_pairs]:
        for side in means:
            tokens, labels = torch.tensor([pair[f"{side}_input_ids"]]), torch.tensor(pair[f"{side}_labels"])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=tokens).logits[0, :-1], dim=-1)
            scored = labels[1:] != -100
            means[side].append(log_probs[scored, labels[1:][scored]].mean())
    return torch.stack(means["chosen"]), torch.stack(means["rejected"])


def test_ipo_and_simpo_first_steps(tiny_assets, pairs, tmp_path):
    """IPO (length-normalised, with the reference) equals TRL's DPOTrainer; SimPO (no reference) at step 1 equals
    TRL's CPO SimPO loss on mean log-probabilities computed in transformers."""
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    out = tmp_path / "ipo"
    extra = ["loss.loss_type=ipo", "max_steps_per_epoch=2", "dataset_val=null", "run_val_every_n_steps=null"]
    run_recipe(RECIPE, pairs["config"], _overrides(tiny_assets, out, pairs["adapter"], *extra), cwd=tmp_path)
    ipo = _records(out)
    trl_losses, _ = _trl_run(tiny_assets, pairs["adapter"], pairs["tokenizer"], tmp_path / "trl", "ipo", 2)
    print("IPO recipe", [ipo[s]["loss"] for s in (1, 2)], "TRL", trl_losses)
    assert [ipo[s]["loss"] for s in (1, 2)] == pytest.approx(trl_losses, rel=2e-6)  # float32, losses near 25
    assert ipo[1]["loss"] == pytest.approx((1 / (2 * BETA)) ** 2, rel=1e-6)  # policy == reference: (0 - 1/2b)^2

    out = tmp_path / "simpo"
    extra = ["loss._component_=tune.rlhf.loss.SimPOLoss", "~loss.beta", "max_steps_per_epoch=1"]
    extra += ["dataset_val=null", "run_val_every_n_steps=null", "precompute_ref_log_probs=True"]
    proc = run_recipe(
        RECIPE, pairs["config"], [*_overrides(tiny_assets, out, pairs["adapter"])[:-1], *extra], cwd=tmp_path
    )
    # a reference-free loss has no reference log-probs to precompute: said, not silently ignored
    assert "precompute_ref_log_probs has no effect: tune.rlhf.loss.SimPOLoss" in proc.stdout + proc.stderr
    simpo = _records(out)[1]
    chosen, rejected = _hf_mean_log_probs(tiny_assets, Path(pairs["pairs_file"]), BATCH_SIZE)
    stand_in = SimpleNamespace(
        alpha=0.0, loss_type="simpo", simpo_gamma=0.5, beta=2.0, label_smoothing=0.0,
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )  # fmt: skip
    losses, chosen_rewards, rejected_rewards = cpo.CPOTrainer.cpo_loss(stand_in, chosen, rejected)
    print(f"SimPO step 1: recipe {simpo['loss']:.7f}, TRL on transformers' log-probs {losses.mean().item():.7f}")
    assert simpo["loss"] == pytest.approx(losses.mean().item(), abs=1e-5, rel=0)
    assert simpo["rewards/margins"] == pytest.approx((chosen_rewards - rejected_rewards).mean().item(), abs=1e-5)


def test_first_steps_equal_trl_dpo_trainer(tiny_assets, pairs, recipe_run, tmp_path):
    trl_losses, trl_logs = _trl_run(tiny_assets, pairs["adapter"], pairs["tokenizer"], tmp_path / "trl")
    records = _records(recipe_run)
    assert len(trl_losses) == len(trl_logs) == NUM_STEPS
    worst = {}
    for step, (trl_loss, trl_log) in enumerate(zip(trl_losses, trl_logs), start=1):
        ours = records[step]
        worst["loss"] = max(worst.get("loss", 0.0), abs(ours["loss"] - trl_loss))
        for key in [*METRICS, "grad_norm"]:
            worst[key] = max(worst.get(key, 0.0), abs(ours[key] - trl_log[key]))
        print(f"step {step}: recipe loss {ours['loss']:.7f}  TRL {trl_loss:.7f}  margins {ours['rewards/margins']:.6f}")
    print("max |recipe - TRL| over the steps:", {k: f"{v:.1e}" for k, v in worst.items()})
    assert worst["loss"] < 1e-5
    for key in METRICS:
        assert worst[key] < 1e-4, key
    assert worst["grad_norm"] < 1e-4 * max(r["grad_norm"] for r in records.values())
    assert records[NUM_STEPS]["rewards/margins"] != 0  # the run moved away from the reference


def test_outputs_load_in_transformers_and_peft(tiny_assets, recipe_run):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = recipe_run / f"step_{NUM_STEPS}"
    merged = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokens = torch.randint(3, 320, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        peft_logits = PeftModel.from_pretrained(base, final / "adapter").eval()(input_ids=tokens).logits
        merged_logits = merged(input_ids=tokens).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=1e-5)
    assert (peft_logits - base_logits).abs().max() > 1e-3  # the adapter learned something to compare


def test_resume_equals_the_uninterrupted_run(tiny_assets, pairs, recipe_run, tmp_path):
    # a crash after step 2: later checkpoints and the log gone; seed 0 and shuffling on would hide nothing here
    out = tmp_path / "resumed"
    shutil.copytree(recipe_run, out)
    shutil.rmtree(out / "logs")
    shutil.rmtree(out / f"step_{NUM_STEPS}")
    overrides = _overrides(tiny_assets, out, pairs["adapter"], "save_every_n_steps=2", "resume_from_checkpoint=True")
    run_recipe(RECIPE, pairs["config"], overrides, cwd=tmp_path)
    resumed, uninterrupted = _records(out), _records(recipe_run)
    assert sorted(resumed) == [3, 4]
    for step, record in resumed.items():
        for key in ("loss", *METRICS):
            assert record[key] == pytest.approx(uninterrupted[step][key], abs=1e-6, rel=0), (step, key)
    final = f"step_{NUM_STEPS}/adapter/adapter_model.safetensors"
    expected = load_file(recipe_run / final)
    for key, value in load_file(out / final).items():
        torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=0, msg=key)


def test_precomputed_reference_log_probs_train_as_the_reference_pass(tiny_assets, pairs, tmp_path):
    # TRL's precompute_ref_log_probs: the reference's log-probs of every pair computed once before training and
    # looked up by dataset index at each step (shuffled, so batch order differs from dataset order) give the losses
    # and metrics of running the reference at every step
    runs = {}
    for name, extra in [("every_step", []), ("precomputed", ["precompute_ref_log_probs=True"])]:
        out = tmp_path / name
        overrides = _overrides(tiny_assets, out, pairs["adapter"], "shuffle=True", "seed=3", *extra)
        proc = run_recipe(RECIPE, pairs["config"], overrides, cwd=tmp_path)
        assert ("Reference log-probabilities of" in proc.stdout + proc.stderr) == bool(extra)
        runs[name] = _records(out)
    precomputed, every_step = runs["precomputed"], runs["every_step"]
    assert sorted(precomputed) == sorted(every_step) == list(range(1, NUM_STEPS + 1))
    # at step 1 the policy is the reference (the starting adapter's B is zero): every reward is 0 up to rounding,
    # and a batching that rounds differently flips rewards/accuracies (0.5 on one CPU, 0.0 on another). The code
    # determines the rewards there, not their sign, so the rewards are checked and the accuracy is not
    for run in (precomputed, every_step):
        assert max(abs(run[1]["rewards/chosen"]), abs(run[1]["rewards/rejected"])) < 1e-6
    for step, record in precomputed.items():
        for key in ("loss", *METRICS):
            if step == 1 and key == "rewards/accuracies":
                continue
            assert record[key] == pytest.approx(every_step[step][key], abs=1e-6, rel=0), (step, key)
    assert precomputed[NUM_STEPS]["loss"] != precomputed[1]["loss"]


def test_unsupported_settings_and_sft_data_are_refused_clearly(tiny_assets, tmp_path):
    pairs_file = write_preference_messages(tmp_path / "pairs.json", 8, 0)
    common = [f"assets_dir={tiny_assets}", f"output_dir={tmp_path / 'out'}", f"dataset.data_files={pairs_file}"]
    proc = run_recipe(
        RECIPE, CONFIG, [*common, "dataset.packed=True", "finetuning_schedule=auto"], tmp_path, check=False
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "dataset.packed = True: is not supported by this recipe (a chosen and a rejected sequence" in proc.stderr
    assert "finetuning_schedule = 'auto': is not supported by this recipe" in proc.stderr  # reported together
    sft = ["dataset._component_=tune.datasets.alpaca_dataset", f"dataset.data_files={tiny_assets / 'train.json'}"]
    proc = run_recipe(RECIPE, CONFIG, [*common, *sft], tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "DPO trains on preference pairs (chosen_input_ids" in proc.stderr, proc.stderr[-2000:]


def _preference_accuracy(model, dataset) -> float:
    """The share of pairs whose chosen completion the model finds more likely than the rejected one (summed
    log-probabilities over the completion tokens, computed here by hand)."""
    wins = 0
    for pair in dataset:
        scores = []
        for side in ("chosen", "rejected"):
            tokens, labels = torch.tensor([pair[f"{side}_input_ids"]]), torch.tensor(pair[f"{side}_labels"])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=tokens).logits[0, :-1], dim=-1)
            scored = labels[1:] != -100
            scores.append(log_probs[scored, labels[1:][scored]].sum().item())
        wins += scores[0] > scores[1]
    return wins / len(dataset)


def test_dpo_learns_the_generated_preference(tiny_assets, tmp_path):
    """On held-out pairs of the generated task, the trained model prefers the chosen answers far more often than
    the model it started from, and its implicit reward (the margin over the reference) ranks them too."""
    from transformers import LlamaForCausalLM

    from tune.datasets import preference_dataset
    from tune.models.llama2 import llama2_tokenizer

    train = write_preference_messages(tmp_path / "train.json", 192, seed=0)
    held_out = write_preference_messages(tmp_path / "held_out.json", 48, seed=1)
    out = tmp_path / "run"
    overrides = [
        f"assets_dir={tiny_assets}", f"output_dir={out}", f"dataset.data_files={train}", "batch_size=8",
        "epochs=2", "max_steps_per_epoch=null", "optimizer.lr=3e-3", "shuffle=True",
        "dataset_val={_component_: tune.datasets.preference_dataset, source: json, split: train, "
        f"data_files: {held_out}}}",
        "run_val_every_n_steps=48",
    ]  # fmt: skip
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path, timeout=600)
    records = read_jsonl(out / "logs" / "log.jsonl")
    validation = [r for r in records if "val_loss" in r][-1]

    tokenizer = llama2_tokenizer(str(tiny_assets / "tokenizer.model"), max_seq_len=256, prompt_template=None)
    pairs = preference_dataset(tokenizer, source="json", data_files=str(held_out), split="train")
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    trained = LlamaForCausalLM.from_pretrained(out / "step_48", dtype=torch.float32).eval()
    before, after = _preference_accuracy(base, pairs), _preference_accuracy(trained, pairs)
    losses = [r["loss"] for r in records if "loss" in r]
    print(
        f"held-out pairs: chosen preferred {before:.3f} before, {after:.3f} after; implicit reward accuracy "
        f"{validation['val_rewards/accuracies']:.3f}, margin {validation['val_rewards/margins']:.3f}; "
        f"training loss {losses[0]:.4f} -> {sum(losses[-4:]) / 4:.4f} (last 4 steps)"
    )
    assert after >= before + 0.25 and after >= 0.8
    assert validation["val_rewards/accuracies"] >= 0.8
