"""A torchtune config moved by its prefix gives torchtune's losses: torchtune 0.6.1 itself and tune run the same
config on the same tiny model and data, and log the same losses.

The config is torchtune's own ``llama2/7B_lora_single_device`` (the example of the migration guide: alpaca data, the
Llama 2 tokenizer with its default ``Llama2ChatTemplate``), read from torchtune's wheel and changed, identically for
both systems, only where a tiny CPU run needs it: the model's size (its component builder), the tokenizer file, the
data file, the checkpoint, CPU/fp32, two steps, a fixed seed and a JSON-lines logger (``seed: null`` would shuffle
the two runs differently). Everything else, the default prompt template, shuffling, gradient accumulation (8), the
scheduler and the loss, stays torchtune's. tune runs the copy with ``torchtune.`` replaced by ``tune.``. The tiny
samples are longer than the 256-token ``max_seq_len``, so truncation is part of what is compared (torchtune's Llama 2
tokenizer trains the EOS it writes over a cut answer's last token; tune's datasets did not, 4e-4 apart at step 1).

torchtune runs from its wheel with the packages it imports that tune's environment lacks or has in another
version (torchao 0.15: torchtune 0.6.1 imports APIs that later torchao releases removed), installed once with
``pip install --no-deps --target`` into ``~/.cache/tune-tests`` (``TUNE_TEST_CACHE``), from the package index.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.recipes.utils import MODEL_SIZES, ROOT, VOCAB_SIZE, build_tiny_assets, read_jsonl

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
_CONFIG = "llama2/7B_lora_single_device"
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


def _config(site: Path, assets: Path, out: Path, prefix: str) -> Path:
    """torchtune's config from its wheel, with the tiny-run changes, under ``prefix`` (torchtune or tune)."""
    text = (site / "recipes" / "configs" / f"{_CONFIG}.yaml").read_text()  # torchtune's wheel ships its configs
    if prefix == "tune":
        text = text.replace("torchtune.", "tune.")
    config = yaml.safe_load(text)
    config["model"].update(
        _component_=f"{prefix}.models.llama2.lora_llama2",
        vocab_size=VOCAB_SIZE,
        num_layers=MODEL_SIZES["num_hidden_layers"],
        num_heads=MODEL_SIZES["num_attention_heads"],
        num_kv_heads=MODEL_SIZES["num_key_value_heads"],
        embed_dim=MODEL_SIZES["hidden_size"],
        intermediate_dim=MODEL_SIZES["intermediate_size"],
        max_seq_len=512,
    )
    config["tokenizer"].update(path=str(assets / "tokenizer.model"), max_seq_len=256)
    config["checkpointer"].update(checkpoint_dir=str(assets / "llama"), checkpoint_files=["model.safetensors"])
    config["dataset"].update(_component_=f"{prefix}.datasets.alpaca_dataset", source="json", split="train")
    config["dataset"]["data_files"] = str(assets / "train.json")
    config["metric_logger"] = {"_component_": "gpu_check_components.TimedLogger", "log_dir": str(out / "logs")}
    config.update(output_dir=str(out), device="cpu", dtype="fp32", seed=0, max_steps_per_epoch=_STEPS)
    config.update(log_peak_memory_stats=False, enable_activation_checkpointing=False)
    path = out.parent / f"{prefix}.yaml"
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


def test_torchtunes_llama2_lora_config_gives_torchtunes_losses_under_tune(torchtune_site, tmp_path):
    assets = tmp_path / "assets"
    assets.mkdir()
    build_tiny_assets(assets)
    benchmarks = str(ROOT / "benchmarks")  # the JSON-lines logger both systems get
    ours = _run("tune", _config(torchtune_site, assets, tmp_path / "tune", "tune"), tmp_path, [str(ROOT), benchmarks])
    theirs = _run(
        "torchtune",
        _config(torchtune_site, assets, tmp_path / "torchtune", "torchtune"),
        tmp_path,
        [str(torchtune_site), benchmarks],
    )
    assert [r["step"] for r in theirs] == [r["step"] for r in ours] == list(range(1, _STEPS + 1))
    for mine, reference in zip(ours, theirs):
        # the same tokens through the same fp32 math: equal up to float32 rounding of the summed losses
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-5), (mine, reference)
