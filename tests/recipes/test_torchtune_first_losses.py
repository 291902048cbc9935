"""A torchtune config moved by its prefix gives torchtune's losses: torchtune 0.6.1 itself and tune run the same
config on the same tiny model and data, and log the same losses.

The configs are torchtune's own LoRA single-device configs of each family, read from torchtune's wheel:
``llama2/7B_lora_single_device`` (the migration guide's example: alpaca data, the Llama 2 tokenizer with its default
``Llama2ChatTemplate``) and ``llama3_2/1B_lora_single_device`` (Llama 3's tiktoken tokenizer and layout, tied
embeddings, scaled RoPE) in the default tier; Mistral 7B (``MistralChatTemplate``), Qwen2 and Qwen2.5 0.5B (tied
embeddings, q/k/v biases), Gemma 2B (explicit head_dim, one KV head), Phi-3 mini and Phi-4 14B (fused projections
in the checkpoint) marked slow. Each is changed, identically for both systems, only where a tiny CPU run needs it:
the model's size (the family's LoRA component builder, with the arguments beyond the sizes that torchtune's named
builder passes), the tokenizer files (tests/tune/data/_tiny_tokenizers.py, as tests/recipes/test_torchtune_tokens.py
builds them), the data file (alpaca rows: the ``alpaca_cleaned_dataset`` some configs name is ``alpaca_dataset``
on other data), a tiny Hugging Face checkpoint of the family's architecture (the checkpointer's ``model_type`` stays
the config's), CPU/fp32, two steps, a fixed seed and a JSON-lines logger (``seed: null`` would shuffle the two runs
differently). Everything else, the prompt template, shuffling, batch size, gradient accumulation (8), the LoRA
settings, the scheduler and the loss, stays torchtune's. tune runs the copy with ``torchtune.`` replaced by
``tune.``. About a third of the tiny samples are longer than the 256-token ``max_seq_len``, so truncation is part of
what is compared (torchtune's Llama 2 tokenizer trains the EOS it writes over a cut answer's last token; tune's
datasets did not, 4e-4 apart at step 1), except for Qwen, whose configs leave ``max_seq_len`` null: set, it makes
torchtune's Qwen tokenizers mask every sample's final EOS (a torchtune bug, see ``_QWEN_FAMILY``).

torchtune runs from its wheel with the packages it imports that tune's environment lacks or has in another
version (torchao 0.15: torchtune 0.6.1 imports APIs that later torchao releases removed), installed once with
``pip install --no-deps --target`` into ``~/.cache/tune-tests`` (``TUNE_TEST_CACHE``), from the package index.
"""

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes.utils import (
    MODEL_SIZES,
    ROOT,
    VOCAB_SIZE,
    _write_alpaca,
    build_tiny_assets,
    read_jsonl,
    save_spread_hf_model,
)

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
_MAX_SEQ_LEN = 256  # the tokenizers'; about a third of the tiny samples are longer


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


@dataclass(frozen=True)
class _Family:
    """How a family's case is built: its LoRA component builder (the named builders take no sizes), the
    arguments torchtune's named builder of the config passes beyond the sizes, the tiny Hugging Face checkpoint of
    that architecture, and its tiny tokenizer (a key of tests/recipes/test_torchtune_tokens.py's ``_tokenizers``)."""

    builder: str  # after ``torchtune.`` / ``tune.``
    hf_model: str  # the transformers class of the checkpoint
    tokenizer: str
    model: dict = field(default_factory=dict)  # the builder's arguments beyond the sizes
    hf: dict = field(default_factory=dict)  # the checkpoint's config beyond the sizes, agreeing with ``model``
    sizes: dict = field(default_factory=dict)  # changes to MODEL_SIZES
    max_seq_len: int | None = _MAX_SEQ_LEN  # the tokenizer's


_QWEN = dict(norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True)  # Qwen2 / Qwen2.5 0.5B's
_QWEN_HF = dict(rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                tie_word_embeddings=True)  # fmt: skip
# Phi-3's config names token ids of the real vocabulary (32000): none here
_PHI_HF = dict(rms_norm_eps=1e-5, pad_token_id=None, eos_token_id=None, tie_word_embeddings=False)
# torchtune's configs leave the Qwen tokenizers' max_seq_len null, and so do these cases: with one set, torchtune
# 0.6.1's Qwen2 / Qwen2.5 tokenizers mask the final EOS of every sample, cut or not (its ``truncate`` sets the last
# mask value to True whenever it is not already, https://github.com/meta-pytorch/torchtune/issues/2792), where tune
# trains it on a sample that was not cut.
_QWEN_FAMILY = dict(model=_QWEN, hf=_QWEN_HF, max_seq_len=None)
_HEAD_DIM = MODEL_SIZES["hidden_size"] // MODEL_SIZES["num_attention_heads"]
_FAMILIES = {
    # Llama 3's tiktoken tokenizer, tied embeddings, scaled RoPE (lora_llama3_2's defaults are the 1B's)
    "llama3_2": _Family(
        "models.llama3_2.lora_llama3_2",
        "LlamaForCausalLM",
        "llama3",
        hf=dict(
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
    # MistralChatTemplate by default; lora_mistral's defaults are the 7B's (norm_eps 1e-5, RoPE base 10000)
    "mistral": _Family(
        "models.mistral.lora_mistral", "MistralForCausalLM", "mistral", hf=dict(rms_norm_eps=1e-5, head_dim=_HEAD_DIM)
    ),
    # vocab.json + merges.txt, q/k/v biases, tied embeddings
    "qwen2": _Family("models.qwen2.lora_qwen2", "Qwen2ForCausalLM", "qwen2", **_QWEN_FAMILY),
    "qwen2_5": _Family("models.qwen2.lora_qwen2", "Qwen2ForCausalLM", "qwen2_5", **_QWEN_FAMILY),
    # Gemma 2B's explicit head_dim, GELU (tanh), (1 + w) RMSNorm, scaled and tied embeddings, one KV head
    "gemma": _Family(
        "models.gemma.lora_gemma",
        "GemmaForCausalLM",
        "gemma",
        model=dict(head_dim=_HEAD_DIM),
        hf=dict(rms_norm_eps=1e-6, head_dim=_HEAD_DIM, tie_word_embeddings=True),
        sizes=dict(num_key_value_heads=1),
    ),
    # fused qkv and gate/up projections in the checkpoint; Phi-3 mini has as many KV heads as heads
    "phi3": _Family(
        "models.phi3.lora_phi3",
        "Phi3ForCausalLM",
        "phi3",
        hf=_PHI_HF,
        sizes=dict(num_key_value_heads=MODEL_SIZES["num_attention_heads"]),
    ),
    # torchtune's lora_phi4_14b is lora_phi3 with norm_eps 1e-5 and the default RoPE base; grouped-query attention
    "phi4": _Family("models.phi3.lora_phi3", "Phi3ForCausalLM", "phi4", hf=_PHI_HF),
}

# torchtune's config and its family ("llama2": the checkpoint and tokenizer of tests/recipes/utils.build_tiny_assets)
_CASES = {
    "llama2/7B_lora_single_device": "llama2",  # the migration guide's example: the default Llama2ChatTemplate
    "llama3_2/1B_lora_single_device": "llama3_2",
    "mistral/7B_lora_single_device": "mistral",
    "qwen2/0.5B_lora_single_device": "qwen2",
    "qwen2_5/0.5B_lora_single_device": "qwen2_5",
    "gemma/2B_lora_single_device": "gemma",
    "phi3/mini_lora_single_device": "phi3",
    "phi4/14B_lora_single_device": "phi4",
}
_DEFAULT_TIER = ("llama2/7B_lora_single_device",)  # the migration guide's example; the others are slow


def _tiny_checkpoint(path: Path, family: _Family, vocab_size: int) -> dict:
    """A tiny checkpoint of ``family``'s architecture (weights normal(0, 0.08), larger than the default init so
    that a step moves the loss) saved in Hugging Face's format into ``path``; returns its sizes."""
    import transformers

    sizes = {**MODEL_SIZES, **family.sizes}
    model_class = getattr(transformers, family.hf_model)
    config = model_class.config_class(vocab_size=vocab_size, max_position_embeddings=512, **sizes, **family.hf)
    torch.manual_seed(0)
    save_spread_hf_model(model_class(config), path)
    return sizes


def _case_assets(family: str, root: Path) -> dict:
    """The tokenizer's arguments, the checkpoint, the model's arguments and the data file of a case."""
    root.mkdir(parents=True, exist_ok=True)
    # alpaca rows enough for _STEPS steps of the largest config batch (4 x 8 accumulated)
    _write_alpaca(root / "alpaca.json", num_samples=80, seed=0)
    case = {"data": root / "alpaca.json"}
    if family == "llama2":
        build_tiny_assets(root)  # Llama 2's tokenizer and checkpoint
        model = {"_component_": "models.llama2.lora_llama2", "vocab_size": VOCAB_SIZE, **_size_args(MODEL_SIZES)}
        return {**case, "checkpoint": root / "llama", "tokenizer": {"path": str(root / "tokenizer.model")},
                "model": model}  # fmt: skip
    from tests.recipes.test_torchtune_tokens import _ours, _tokenizers

    spec = _FAMILIES[family]
    tokenizer = _tokenizers(root)[spec.tokenizer]
    built = _ours(tokenizer)
    # the vocabulary covers the special tokens, whose ids may lie past the tokenizer's vocab_size, 64-aligned
    vocab = -(-max(built.vocab_size, max(built.special_tokens.values()) + 1) // 64) * 64
    sizes = _tiny_checkpoint(root / family, spec, vocab)
    model = {"_component_": spec.builder, "vocab_size": vocab, **_size_args(sizes), **spec.model}
    return {**case, "checkpoint": root / family, "tokenizer": tokenizer["kwargs"],
            "tokenizer_component": tokenizer["component"], "model": model, "max_seq_len": spec.max_seq_len}  # fmt: skip


def _size_args(sizes: dict) -> dict:
    """The component builder's size arguments for Hugging Face's config sizes."""
    return dict(num_layers=sizes["num_hidden_layers"], num_heads=sizes["num_attention_heads"],
                num_kv_heads=sizes["num_key_value_heads"], embed_dim=sizes["hidden_size"],
                intermediate_dim=sizes["intermediate_size"], max_seq_len=512)  # fmt: skip


def _config(site: Path, name: str, case: dict, out: Path, prefix: str) -> Path:
    """torchtune's config ``name`` from its wheel, with the tiny-run changes, under ``prefix`` (torchtune or tune)."""
    text = (site / "recipes" / "configs" / f"{name}.yaml").read_text()  # torchtune's wheel ships its configs
    if prefix == "tune":
        text = text.replace("torchtune.", "tune.")
    config = yaml.safe_load(text)
    model = case["model"]
    config["model"].update({**model, "_component_": f"{prefix}.{model['_component_']}"})
    if "tokenizer_component" in case:  # the tiny tokenizer's arguments are for the config's tokenizer builder
        assert config["tokenizer"]["_component_"] == f"{prefix}.{case['tokenizer_component']}", name
    config["tokenizer"].update(**case["tokenizer"], max_seq_len=case.get("max_seq_len", _MAX_SEQ_LEN))
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


@pytest.mark.parametrize(
    "name", [name if name in _DEFAULT_TIER else pytest.param(name, marks=pytest.mark.slow) for name in _CASES]
)
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
