"""``tune export`` (tune/_cli/_export.py, tune/training/checkpointing/_export.py) on real tiny runs.

Three runs of the tiny Llama of the recipe tests (tests/recipes/utils.py: a SentencePiece tokenizer and a random
``LlamaForCausalLM``, here with the transformers tokenizer files and a chat template beside its weights, which the
checkpointer copies into every checkpoint): full fine-tuning, LoRA, and LoRA with ``save_adapter_weights_only``.
Each is exported and compared with what the run saved, through an implementation independent of the export:

- full: the exported directory in ``transformers`` against tune's model loaded from the run's checkpoint
  (``tune.models.from_hf``), logits within 1e-5;
- LoRA (merged by the run, or merged here from an adapter-only checkpoint): the exported directory in
  ``transformers`` against the base model with the run's adapter applied by PEFT, logits within 1e-5;
- GGUF of the adapter-only run: transformers' GGUF reader against the same PEFT model, within f16 rounding.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes.utils import ASSETS, build_tiny_assets, run_recipe

pytestmark = pytest.mark.integration

CHAT_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
_STEPS = ["max_steps_per_epoch=2"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """The tiny assets, with the files an inference stack needs beside the weights (``llama/``), which a run copies
    into its checkpoints: transformers' tokenizer files and a chat template."""
    import transformers

    root = tmp_path_factory.mktemp("export_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    assets = build_tiny_assets(root)
    shutil.copy(assets / "tokenizer.model", assets / "llama" / "tokenizer.model")
    tokenizer = transformers.LlamaTokenizer.from_pretrained(assets / "llama")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(assets / "llama")
    return assets


@pytest.fixture(scope="module")
def runs(assets, tmp_path_factory) -> dict[str, Path]:
    """output_dir of each tiny run: ``full``, ``lora``, ``adapter_only``; and ``assets``."""
    root = tmp_path_factory.mktemp("export_runs")
    out = {"assets": assets}
    for name, recipe, config, extra in [
        ("full", "full_finetune_single_device", "full_tiny.yaml", []),
        ("lora", "lora_finetune_single_device", "lora_tiny.yaml", []),
        ("adapter_only", "lora_finetune_single_device", "lora_tiny.yaml", ["save_adapter_weights_only=True"]),
    ]:
        out[name] = root / name
        overrides = [f"assets_dir={assets}", f"output_dir={out[name]}", *_STEPS, *extra]
        run_recipe(recipe, ASSETS / config, overrides, cwd=root)
    return out


def _tokens() -> torch.Tensor:
    return torch.randint(3, 320, (2, 20), generator=torch.Generator().manual_seed(0))


def _hf_logits(directory: Path, **kwargs) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs).eval()
    with torch.no_grad():
        return model(input_ids=_tokens()).logits


def _peft_logits(assets: Path, adapter_dir: Path) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return model(input_ids=_tokens()).logits


def _assert_logits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    print(f"{what}: max |logits diff| {(actual - expected).abs().max().item():.2e}")
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def _step_dir(output_dir: Path) -> Path:
    (step,) = [p for p in output_dir.iterdir() if p.name.startswith("step_")]
    return step


def _one_line_error(code: int, err: str) -> str:
    assert code == 1 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("tune: error: ")
    return err


def test_full_run_exports_the_runs_model(runs, tune, tmp_path):
    from tune.models import from_hf

    out = tmp_path / "full-hf"
    code, stdout, err = tune("export", str(runs["full"]), "--format", "hf", "--out", str(out))
    assert code == 0, err
    assert f"to {out}" in stdout and "note:" not in stdout  # nothing an inference stack needs is missing
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer.model"} <= names
    assert (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert not names & {"recipe_state.pt", "config.yaml", ".complete", "adapter"}  # run state stays behind

    tune_model = from_hf(_step_dir(runs["full"]), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = tune_model(_tokens())
    _assert_logits_equal(_hf_logits(out), expected, "full run, exported vs tune's model of the checkpoint")


def test_lora_run_exports_the_merged_model(runs, tune, tmp_path):
    out = tmp_path / "lora-hf"
    code, _, err = tune("export", str(_step_dir(runs["lora"])), "--format", "hf", "--out", str(out))
    assert code == 0, err
    assert not (out / "adapter").exists()
    expected = _peft_logits(runs["assets"], _step_dir(runs["lora"]) / "adapter")
    _assert_logits_equal(_hf_logits(out), expected, "LoRA run, exported vs base + adapter in PEFT")


def test_adapter_only_run_is_merged_into_its_base(runs, tune):
    step = _step_dir(runs["adapter_only"])
    assert not list(step.glob("*.safetensors"))  # the run saved the adapter alone
    code, stdout, err = tune("export", str(runs["adapter_only"]), "--format", "hf")
    assert code == 0, err
    out = runs["adapter_only"] / "exports" / f"{step.name}-hf"  # the default --out
    assert f"to {out}" in stdout
    expected = _peft_logits(runs["assets"], step / "adapter")
    _assert_logits_equal(_hf_logits(out), expected, "adapter-only run, merged by tune export vs PEFT")


def test_hf_dtype_casts_weights_and_config(runs, tune, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "bf16"
    code, _, err = tune("export", str(runs["adapter_only"]), "--format", "hf", "--dtype", "bf16", "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.bfloat16}


def test_adapter_only_run_to_gguf(runs, tune, tmp_path):
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    path = tmp_path / "model.f16.gguf"
    code, _, err = tune("export", str(runs["adapter_only"]), "--format", "gguf", "--out", str(path))
    assert code == 0, err
    expected = _peft_logits(runs["assets"], _step_dir(runs["adapter_only"]) / "adapter")
    diff = (_hf_logits(tmp_path, gguf_file=path.name) - expected).abs().max().item()
    print(f"GGUF f16 of the merged LoRA run vs PEFT: max |logits diff| {diff:.2e}")
    assert diff < 1.5e-2  # f16 rounding of the weights (the bound of tests/tune/training/test_export_gguf.py)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    original = AutoTokenizer.from_pretrained(runs["assets"] / "llama")
    for text in ["Add the two numbers. 12 and 30", "what is seven plus two"]:
        assert tokenizer(text).input_ids == original(text).input_ids
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_dora_with_rank_and_alpha_patterns_merges_like_peft(assets, tune, tmp_path):
    # an adapter-only checkpoint made by PEFT itself: DoRA magnitudes, and per-module ranks and alphas
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_dora=True, init_lora_weights=False,
        rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3},
    )  # fmt: skip
    model = get_peft_model(base, config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_magnitude_vector" in name:  # away from ||W||, so the magnitude matters
                param.mul_(1 + 0.1 * torch.randn_like(param))
    step = tmp_path / "step_7"
    model.save_pretrained(step / "adapter")
    with torch.no_grad():
        expected = model(input_ids=_tokens()).logits
    out = tmp_path / "merged"
    code, _, err = tune("export", str(step), "--format", "hf", "--base", str(assets / "llama"), "--out", str(out))
    assert code == 0, err
    _assert_logits_equal(_hf_logits(out), expected, "DoRA with rank/alpha patterns, merged vs PEFT")


def test_unsupported_family_is_one_line(tune, tmp_path):
    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    (model / "model.safetensors").write_bytes(b"")
    code, _, err = tune("export", str(model), "--format", "gguf", "--out", str(tmp_path / "x.gguf"))
    assert "GGUF export does not support model_type 'qwen3_moe'; supported: llama, mistral, qwen2" in _one_line_error(
        code, err
    )


def test_user_errors_are_one_line(runs, tune, tmp_path):
    code, _, err = tune("export", str(tmp_path / "missing"), "--format", "hf")
    assert "is not a directory" in _one_line_error(code, err)
    code, _, err = tune("export", str(runs["full"]), "--format", "hf", "--dtype", "q8_0")
    assert "q8_0 is a GGUF type" in _one_line_error(code, err)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    code, _, err = tune("export", str(runs["full"]), "--format", "hf", "--out", str(taken))
    assert "exists and is not empty" in _one_line_error(code, err)
    base = tmp_path / "no-base"
    base.mkdir()
    code, _, err = tune(
        "export", str(runs["adapter_only"]), "--format", "hf", "--base", str(base), "--out", str(tmp_path / "y")
    )
    assert "holds no weights" in _one_line_error(code, err)
    meta = tmp_path / "meta" / "step_1"
    meta.mkdir(parents=True)
    (meta / ".complete").write_text(json.dumps({"format": "meta", "global_step": 1}))
    code, _, err = tune("export", str(meta.parent), "--format", "gguf")
    assert "holds a 'meta'-format checkpoint" in _one_line_error(code, err)


def test_help_documents_every_flag_with_an_example(tune):
    code, out, _ = tune("export", "--help")
    assert code == 0 and "examples:" in out
    for flag in ("--format", "--dtype", "--out", "--base"):
        assert flag in out
    assert out.count("e.g.") >= 5
