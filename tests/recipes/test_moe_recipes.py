"""The load-balancing loss of mixture-of-experts models in the SFT recipes (tune.training.RouterAuxLoss), on the
tiny Qwen3-MoE of tests/recipes/_family_assets.py (2 layers, 8 experts, 2 per token).

The reference is transformers' ``Qwen3MoeForCausalLM`` with ``output_router_logits=True``: its ``loss`` is the
mean cross-entropy plus ``router_aux_loss_coef * aux_loss`` (padding excluded through the attention mask),
trained by a plain ``torch.optim.AdamW`` loop on the same batches.
"""

import os
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import max_difference, run_distributed, train_log
from tests.recipes.utils import loss_records, run_recipe

pytestmark = pytest.mark.integration

COEF = 0.02  # larger than Qwen3-MoE's 0.001 so that the router term moves the losses far beyond the tolerance
LR, WEIGHT_DECAY, STEPS = 1e-3, 0.01, 3


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory):
    """The tiny Qwen3-MoE checkpoint (``hf/``) and ``train.json``."""
    root = tmp_path_factory.mktemp("moe_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    return assets.build_family_assets("qwen3_moe", root / "qwen3_moe")


def _tokenizer():
    from tune.models.qwen3 import qwen3_tokenizer

    return qwen3_tokenizer(str(assets.tokenizer_file("qwen3")), max_seq_len=assets.MAX_SEQ_LEN)


def write_config(
    where: Path, data: Path, out: Path, method: str = "full", model_settings: dict | None = None, **settings
) -> Path:
    """A tiny SFT config for the Qwen3-MoE assets (``model_settings`` add to ``model``, ``settings`` replace
    top-level keys)."""
    model = {"_component_": f"tune.models.qwen3_moe.{'qwen3_moe' if method == 'full' else 'lora_qwen3_moe'}"}
    model.update(assets.tune_dims("qwen3_moe"))
    model["mlp_only_layers"] = []
    if method == "lora":
        model.update(lora_attn_modules=["q_proj", "v_proj"], lora_rank=4, lora_alpha=8.0)
    model.update(model_settings or {})
    cfg = {
        "output_dir": str(out),
        "model": model,
        "tokenizer": {
            "_component_": "tune.models.qwen3.qwen3_tokenizer",
            "path": str(assets.tokenizer_file("qwen3")),
            "max_seq_len": assets.MAX_SEQ_LEN,
        },
        "checkpointer": {
            "_component_": "tune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(data / "hf"),
            "checkpoint_files": ["model.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": str(out),
            "model_type": "QWEN3_MOE",
        },
        "resume_from_checkpoint": False,
        "dataset": {
            "_component_": "tune.datasets.alpaca_dataset",
            "source": "json",
            "data_files": str(data / "train.json"),
            "split": "train",
            "train_on_input": False,
        },
        "collate_fn": "tune.data.padded_collate_sft",  # padding: the router loss must leave it out
        "seed": 0,
        "shuffle": False,
        "batch_size": 2,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": LR, "weight_decay": WEIGHT_DECAY, "foreach": False},
        "loss": {"_component_": "tune.modules.loss.LinearCrossEntropyLoss"},
        "epochs": 1,
        "max_steps_per_epoch": STEPS,
        "gradient_accumulation_steps": 1,
        "metric_logger": {
            "_component_": "tune.training.metric_logging.DiskLogger",
            "log_dir": str(out / "logs"),
            "filename": "log.jsonl",
        },
        "device": "cpu",
        "dtype": "fp32",
    }
    cfg.update(settings)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"moe_{method}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _reference_run(data: Path, num_steps: int, batch_size: int) -> tuple[list[float], list[float]]:
    """transformers' Qwen3-MoE trained by plain AdamW on the recipe's batches, its own loss (cross-entropy mean
    plus ``COEF * aux_loss``) backpropagated; returns the losses and the aux losses."""
    from transformers import Qwen3MoeForCausalLM

    from tune.datasets import alpaca_dataset

    dataset = alpaca_dataset(
        _tokenizer(), source="json", data_files=str(data / "train.json"), split="train", train_on_input=False
    )
    model = Qwen3MoeForCausalLM.from_pretrained(
        data / "hf", dtype=torch.float32, output_router_logits=True, router_aux_loss_coef=COEF
    ).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    losses, aux_losses = [], []
    for step in range(num_steps):
        samples = [dataset[i] for i in range(step * batch_size, (step + 1) * batch_size)]
        length = max(len(s["tokens"]) for s in samples)
        tokens = torch.zeros(batch_size, length, dtype=torch.long)  # right padding, masked out below
        labels = torch.full((batch_size, length), -100, dtype=torch.long)
        attention_mask = torch.zeros(batch_size, length, dtype=torch.long)
        for i, s in enumerate(samples):
            n = len(s["tokens"])
            tokens[i, :n], labels[i, :n], attention_mask[i, :n] = (
                torch.tensor(s["tokens"]),
                torch.tensor(s["labels"]),
                1,
            )
        out = model(input_ids=tokens, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
        aux_losses.append(out.aux_loss.item())
    return losses, aux_losses


def test_full_recipe_with_router_loss_matches_transformers_loop(moe_assets, tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path, moe_assets, out, router_aux_loss_coef=COEF)
    run_recipe("full_finetune_single_device", config, [], cwd=tmp_path, timeout=300)
    records = loss_records(out)
    ref_losses, ref_aux = _reference_run(moe_assets, STEPS, batch_size=2)

    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    losses, aux = [r["loss"] for r in records], [r["router_aux_loss"] for r in records]
    print("recipe losses   ", losses, "\nreference losses", ref_losses)
    print("max |loss diff|", max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)))
    print("max |aux diff| ", max(abs(a - b) for a, b in zip(aux, ref_aux, strict=True)))
    assert losses == pytest.approx(ref_losses, abs=1e-5, rel=0)
    assert aux == pytest.approx(ref_aux, abs=1e-5, rel=0)  # batch_size 2, no accumulation: the step's only batch
    for r in records:  # routing statistics: relative to an even share of the token slots
        assert r["expert_load_max"] >= 1.0 >= r["expert_load_min"] >= 0.0


def test_router_loss_is_logged_but_not_trained_on_at_coefficient_zero(moe_assets, tmp_path):
    # the default (0): the metric is logged, and the loss is the plain cross-entropy of transformers' model
    out = tmp_path / "run"
    run_recipe("lora_finetune_single_device", write_config(tmp_path, moe_assets, out, "lora"), [], cwd=tmp_path)
    records = loss_records(out)
    assert all(r["router_aux_loss"] > 0 for r in records)

    from transformers import Qwen3MoeForCausalLM

    from tune.datasets import alpaca_dataset

    model = Qwen3MoeForCausalLM.from_pretrained(moe_assets / "hf", dtype=torch.float32).eval()
    dataset = alpaca_dataset(
        _tokenizer(), source="json", data_files=str(moe_assets / "train.json"), split="train", train_on_input=False
    )
    first = [dataset[0], dataset[1]]  # step 1 runs before any update: the loss of the checkpoint itself
    total, count = 0.0, 0
    with torch.no_grad():
        for s in first:
            tokens, labels = torch.tensor([s["tokens"]]), torch.tensor([s["labels"]])
            logits = model(input_ids=tokens).logits
            total += torch.nn.functional.cross_entropy(
                logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="sum"
            ).item()
            count += int((labels[0, 1:] != -100).sum())
    assert records[0]["loss"] == pytest.approx(total / count, abs=1e-5, rel=0)


def test_router_aux_loss_leaves_a_dense_model_alone():
    from tune.models.llama2 import llama2
    from tune.training import RouterAuxLoss

    model = llama2(vocab_size=32, num_layers=1, num_heads=2, num_kv_heads=2, embed_dim=16, max_seq_len=8)
    router_loss = RouterAuxLoss(model, coef=0.01, pad_id=0)
    loss = torch.tensor(3.0)
    tokens = torch.ones(1, 4, dtype=torch.long)
    assert not router_loss.enabled
    assert router_loss(loss, tokens, tokens) == (loss, {})
    with pytest.raises(ValueError, match="router_aux_loss_coef must be a number >= 0"):
        RouterAuxLoss(model, coef=-1.0, pad_id=0)


def test_a_negative_coefficient_is_a_config_error(moe_assets, tmp_path):
    config = write_config(tmp_path, moe_assets, tmp_path / "run", router_aux_loss_coef=-0.1)
    proc = run_recipe("full_finetune_single_device", config, [], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "router_aux_loss_coef" in proc.stderr and "must be a number >= 0" in proc.stderr


@pytest.mark.slow
def test_two_ranks_with_router_loss_match_one_device(moe_assets, tmp_path):
    # the router loss is per micro-batch: 2 ranks x batch 1 x 2 accumulation steps see the same 4 micro-batches
    # per step as 1 device x batch 1 x 4 accumulation steps (the sampler deals samples round-robin)
    single, two = tmp_path / "single", tmp_path / "two"
    steps = {"router_aux_loss_coef": COEF, "batch_size": 1}
    run_recipe(
        "full_finetune_single_device",
        write_config(tmp_path / "a", moe_assets, single, gradient_accumulation_steps=4, **steps),
        [],
        cwd=tmp_path,
        timeout=300,
    )
    run_distributed(
        "full_finetune_distributed",
        write_config(tmp_path / "b", moe_assets, two, gradient_accumulation_steps=2, **steps),
        [],
        cwd=tmp_path,
    )
    ref, got = train_log(single), train_log(two)
    diff = max_difference(ref, got, "loss")
    print(f"max |loss(2 ranks) - loss(1 device)| = {diff:.2e}")
    assert diff < 1e-5
    assert max_difference(ref, got, "grad_norm") < 1e-4 * ref[1]["grad_norm"]
