"""torchtune 0.6.1 configs run unchanged under tune's recipes.

tests/recipes/assets/torchtune/*.yaml are the peer benchmark's torchtune configs with ``torchtune.`` replaced by
``tune.`` and their timing logger swapped for tune's DiskLogger: nothing else differs. The test lays out the
files they name (``work/assets/...``, relative to the working directory) with a model of the configs' sizes built
here by ``transformers``, then runs them overriding only what the benchmark driver overrides (``output_dir``,
``max_steps_per_epoch``). The first step's loss is checked against ``transformers`` on the same batch: the base
model for full fine-tuning, and for LoRA too, since LoRA's B starts at zero.
"""

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.recipes.utils import ASSETS, pad_batch, read_jsonl, run_recipe, tiny_dataset

pytestmark = pytest.mark.integration


def _layout(tiny_assets: Path, cwd: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    assets = cwd / "work" / "assets"
    (assets / "tokenizer").mkdir(parents=True)
    shutil.copy(tiny_assets / "tokenizer.model", assets / "tokenizer" / "tokenizer.model")
    shutil.copy(tiny_assets / "train.json", assets / "alpaca_synth.json")
    # the sizes the configs spell out (the harness's ~7M "llama-small")
    config = LlamaConfig(
        vocab_size=8000,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(assets / "llama-small", safe_serialization=True)


def _first_batch_loss(cwd: Path, tiny_assets: Path) -> float:
    from transformers import LlamaForCausalLM

    # the configs' data settings (max_seq_len 512, train_on_input True), shuffled with seed 0: torch's
    # DistributedSampler order for one process, as in torchtune
    dataset = tiny_dataset(tiny_assets, max_seq_len=512, train_on_input=True)
    order = list(torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0))
    tokens, labels = pad_batch([dataset[i] for i in order[:4]])
    model = LlamaForCausalLM.from_pretrained(cwd / "work" / "assets" / "llama-small", dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100).item()


@pytest.mark.parametrize(
    "recipe, config",
    [("full_finetune_single_device", "full_small"), ("lora_finetune_single_device", "lora_qv_small")],
)
def test_torchtune_benchmark_config_runs_unchanged(tiny_assets, tmp_path, recipe, config):
    _layout(tiny_assets, tmp_path)
    overrides = ["output_dir=work/runs/test", "max_steps_per_epoch=3"]
    run_recipe(recipe, ASSETS / "torchtune" / f"{config}.yaml", overrides, cwd=tmp_path, timeout=300)
    out = tmp_path / "work" / "runs" / "test"
    records = [r for r in read_jsonl(out / "logs" / "log.txt") if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    # step 1 saw the batch torch's sampler picks, and computed the loss transformers computes on it
    assert records[0]["loss"] == pytest.approx(_first_batch_loss(tmp_path, tiny_assets), abs=1e-5)
    weights = "adapter/adapter_model.safetensors" if "lora" in config else "model.safetensors"
    assert (out / "step_3" / weights).is_file()
