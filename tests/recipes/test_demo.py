"""The offline demo (`make demo`): its generator, its config under the real recipe, and its evaluation script.

The default tier runs every stage of demo/run_demo.sh on a cut-down data set for one short epoch; the slow tier runs
the demo as shipped and checks that fine-tuning takes held-out exact match from 0 to at least 90%.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.utils import ROOT, read_jsonl, run_recipe

DEMO = ROOT / "demo"


def _python(args: list[str], cwd: Path, timeout: int = 300) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _accuracy(report: str, label: str) -> float:
    line = next(line for line in report.splitlines() if line.startswith(f"[{label}] held-out exact match:"))
    return float(line.rsplit(" ", 1)[1].rstrip("%")) / 100


def test_demo_generator_is_deterministic_and_held_out_lists_are_unseen(tmp_path):
    for name in ("a", "b"):
        args = [str(DEMO / "make_demo.py"), str(tmp_path / name), "--num-train", "300", "--num-heldout", "20"]
        _python(args, tmp_path)
    for file in ("data/train.json", "data/heldout.json", "base_model/model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    # the tokenizer file records the paths it was trained from; its pieces and scores must be equal
    import sentencepiece as spm

    a, b = (spm.SentencePieceProcessor(model_file=str(tmp_path / n / "tokenizer" / "tokenizer.model")) for n in "ab")
    assert a.vocab_size() == b.vocab_size() > 100
    assert all(a.id_to_piece(i) == b.id_to_piece(i) and a.get_score(i) == b.get_score(i) for i in range(a.vocab_size()))
    train = json.loads((tmp_path / "a" / "data" / "train.json").read_text())
    heldout = json.loads((tmp_path / "a" / "data" / "heldout.json").read_text())
    assert len(train) == 300 and len(heldout) == 20
    lists = lambda samples: {s["input"].split(". ", 1)[0] for s in samples}  # noqa: E731
    assert not lists(train) & lists(heldout)


def test_demo_stages_run_with_the_shipped_configs(tmp_path):
    assets, out = tmp_path / "assets", tmp_path / "run"
    _python([str(DEMO / "make_demo.py"), str(assets), "--num-train", "4096", "--num-heldout", "50"], tmp_path)
    # one epoch of 128 steps (batch 32) with 8 warm-up steps instead of the shipped 50 (set for 3 epochs of 187)
    overrides = [f"assets_dir={assets}", f"output_dir={out}", "epochs=1", "lr_scheduler.num_warmup_steps=8"]
    overrides.append("log_every_n_steps=32")
    run_recipe("full_finetune_single_device", "demo/full_single_device", overrides, cwd=tmp_path)
    losses = [r["loss"] for r in read_jsonl(next((out / "logs").glob("*.jsonl"))) if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0]

    def exact_match(checkpoint: Path, label: str) -> float:
        data = ["--data", str(assets / "data" / "heldout.json"), "--label", label]
        tokenizer = ["--tokenizer", str(assets / "tokenizer" / "tokenizer.model")]
        return _accuracy(_python([str(DEMO / "evaluate.py"), str(checkpoint), *tokenizer, *data], tmp_path), label)

    # measured at this scale (CPU, 1 thread): 0/50 before, 13/50 (26%) after the 128 steps; a training step that
    # does not train (no update, or a wrong loss) stays at 0. 10% (5 of 50) leaves room for numerical drift.
    assert exact_match(assets / "base_model", "before") == 0.0
    assert exact_match(out / "step_128", "after") >= 0.10
    generated = run_recipe(
        "generate",
        "demo/generation",
        [
            f"assets_dir={assets}",
            f"checkpointer.checkpoint_dir={out / 'step_128'}",
            "prompt.user=red fig cat. Reverse the list.",
        ],
        cwd=tmp_path,
    )
    assert "Generated" in generated.stderr + generated.stdout


@pytest.mark.slow
def test_demo_learns_the_held_out_tasks(tmp_path):
    # the whole demo as `make demo` runs it, writing into tmp_path
    env = {**os.environ, "TQDM_DISABLE": "1", "DEMO_OUT": str(tmp_path / "demo_out")}
    proc = subprocess.run(
        ["bash", str(DEMO / "run_demo.sh"), str(Path(sys.executable).parent)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _accuracy(proc.stdout, "before") < 0.05
    assert _accuracy(proc.stdout, "after") >= 0.9
