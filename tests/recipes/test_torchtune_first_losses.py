"""A torchtune config moved by its prefix gives torchtune's losses: torchtune 0.6.1 itself and tune run the same
config on the same tiny model and data, and log the same losses.

The configs are torchtune's own ``llama2/7B_lora_single_device`` (the migration guide's example: alpaca data, the
Llama 2 tokenizer with its default ``Llama2ChatTemplate``) and ``llama3_2/1B_lora_single_device`` (Llama 3's
tiktoken tokenizer and layout, tied embeddings, scaled RoPE), read from torchtune's wheel and changed, identically
for both systems, only where a tiny CPU run needs it: the model's size (its component builder), the tokenizer files,
the data file, the checkpoint, CPU/fp32, two steps, a fixed seed and a JSON-lines logger (``seed: null`` would
shuffle the two runs differently). Everything else, the prompt template, shuffling, batch size, gradient
accumulation (8), the scheduler and the loss, stays torchtune's. tune runs the copy with ``torchtune.`` replaced by
``tune.``. The tiny samples are longer than the 256-token ``max_seq_len``, so truncation is part of what is compared
(torchtune's Llama 2 tokenizer trains the EOS it writes over a cut answer's last token; tune's datasets did not, 4e-4
apart at step 1).

torchtune runs from its wheel with the packages it imports that tune's environment lacks or has in another
version (torchao 0.15: torchtune 0.6.1 imports APIs that later torchao releases removed), installed once with
``pip install --no-deps --target`` into ``~/.cache/tune-tests`` (``TUNE_TEST_CACHE``), from the package index.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes.utils import MODEL_SIZES, ROOT, VOCAB_SIZE, _write_alpaca, build_tiny_assets, read_jsonl

pytestmark = pytest.mark.integration

_CACHE = Path(os.environ.get("TUNE_TEST_CACHE", Path.home() / ".cache" / "tune-tests"))
# what torchtune 0.6.1's CLI and recipes import beyond tune's environment, at the versions checked with it
_TORCHTUNE_SITE_PACKAGES = [
    "torchtune==0.6.1",
    "torchao==0.15.0",
    "torchdata==0.11.0",
    "kagglehub==1.0.3",
    "kagglesdk==0.1.38",
    "blobfile==3.3.0",
    "pycryptodomex==3.24.2",
]
_STEPS = 2


@pytest.fixture(scope="session")
def torchtune_site() -> Path:
    """A folder holding torchtune 0.6.1 and the packages above, to put first on ``PYTHONPATH``."""
    site = _CACHE / "torchtune-0.6.1-site"
    if not (site / ".complete").exists():
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--upgrade"]
        command += ["--target", str(site), *_TORCHTUNE_SITE_PACKAGES]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"cannot install torchtune's packages ({' '.join(command)}): {proc.stderr[-800:]}"
        (site / ".complete").touch()
    return site


def _llama3_assets(root: Path) -> dict:
    """Llama 3.2's case: the tiny tiktoken file with Llama 3's special tokens numbered after its ranks (as torchtune
    0.6.1 names them, tests/recipes/test_torchtune_tokens.py), and a tiny tied-embedding Llama 3.2 checkpoint whose
    vocabulary covers them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.recipes.test_torchtune_tokens import _llama3_special_tokens
    from tests.tune.data import _tiny_tokenizers as tiny

    special = _llama3_special_tokens(root)
    vocab = -(-(max(t["id"] for t in json.loads(special.read_text())["added_tokens"]) + 1) // 64) * 64
    config = LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True,
        **MODEL_SIZES,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(root / "llama3_2", safe_serialization=True)
    tokenizer = {"path": str(tiny.tiktoken_file()), "special_tokens_path": str(special)}
    return {"checkpoint": root / "llama3_2", "tokenizer": tokenizer, "vocab_size": vocab, "builder": "llama3_2"}


# torchtune's config, the family's component builder (the named builders take no sizes), and the tiny assets
_CASES = {
    "llama2/7B_lora_single_device": "llama2",  # the migration guide's example: the default Llama2ChatTemplate
    "llama3_2/1B_lora_single_device": "llama3_2",  # Llama 3's tiktoken tokenizer, tied embeddings, scaled RoPE
}


def _case_assets(family: str, root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    build_tiny_assets(root)  # Llama 2's tokenizer and checkpoint
    # alpaca rows enough for _STEPS steps of the largest config batch (Llama 3.2's: 4 x 8 accumulated)
    _write_alpaca(root / "alpaca.json", num_samples=80, seed=0)
    if family == "llama3_2":
        return {**_llama3_assets(root), "data": root / "alpaca.json"}
    tokenizer = {"path": str(root / "tokenizer.model")}
    return {"checkpoint": root / "llama", "tokenizer": tokenizer, "vocab_size": VOCAB_SIZE, "builder": "llama2",
            "data": root / "alpaca.json"}  # fmt: skip


def _config(site: Path, name: str, case: dict, out: Path, prefix: str) -> Path:
    """torchtune's config ``name`` from its wheel, with the tiny-run changes, under ``prefix`` (torchtune or tune)."""
    text = (site / "recipes" / "configs" / f"{name}.yaml").read_text()  # torchtune's wheel ships its configs
    if prefix == "tune":
        text = text.replace("torchtune.", "tune.")
    config = yaml.safe_load(text)
    builder = case["builder"]
    config["model"].update(
        _component_=f"{prefix}.models.{builder}.lora_{builder}",
        vocab_size=case["vocab_size"],
        num_layers=MODEL_SIZES["num_hidden_layers"],
        num_heads=MODEL_SIZES["num_attention_heads"],
        num_kv_heads=MODEL_SIZES["num_key_value_heads"],
        embed_dim=MODEL_SIZES["hidden_size"],
        intermediate_dim=MODEL_SIZES["intermediate_size"],
        max_seq_len=512,
    )
    config["tokenizer"].update(**case["tokenizer"], max_seq_len=256)
    config["checkpointer"].update(checkpoint_dir=str(case["checkpoint"]), checkpoint_files=["model.safetensors"])
    config["dataset"].update(_component_=f"{prefix}.datasets.alpaca_dataset", source="json", split="train")
    config["dataset"]["data_files"] = str(case["data"])
    config["metric_logger"] = {"_component_": "gpu_check_components.TimedLogger", "log_dir": str(out / "logs")}
    config.update(output_dir=str(out), device="cpu", dtype="fp32", seed=0, max_steps_per_epoch=_STEPS)
    config.update(log_peak_memory_stats=False, enable_activation_checkpointing=False)
    path = out.parent / f"{prefix}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def _run(prefix: str, config: Path, cwd: Path, pythonpath: list[str]) -> list[dict]:
    module = "torchtune._cli.tune" if prefix == "torchtune" else "tune._cli.main"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(cwd / f"hf_cache_{prefix}"))
    command = [sys.executable, "-m", module, "run", "lora_finetune_single_device", "--config", str(config)]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{prefix}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    out = yaml.safe_load(config.read_text())["output_dir"]
    return [r for r in read_jsonl(Path(out) / "logs" / "steps.jsonl") if "loss" in r]


@pytest.mark.parametrize("name", list(_CASES))
def test_torchtunes_lora_config_gives_torchtunes_losses_under_tune(torchtune_site, tmp_path, name):
    case = _case_assets(_CASES[name], tmp_path / "assets")
    benchmarks = str(ROOT / "benchmarks")  # the JSON-lines logger both systems get
    ours = _run(
        "tune", _config(torchtune_site, name, case, tmp_path / "tune", "tune"), tmp_path, [str(ROOT), benchmarks]
    )
    theirs = _run(
        "torchtune",
        _config(torchtune_site, name, case, tmp_path / "torchtune", "torchtune"),
        tmp_path,
        [str(torchtune_site), benchmarks],
    )
    assert [r["step"] for r in theirs] == [r["step"] for r in ours] == list(range(1, _STEPS + 1))
    for mine, reference in zip(ours, theirs):
        # the same tokens through the same fp32 math: equal up to float32 rounding of the summed losses
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-5), (mine, reference)
