"""Bad input through `tune run`: each user mistake is one `error:` line naming the file, exit status 1, no traceback,
and a save that fails (a full disk) leaves the previous checkpoint intact and resumable.

Cheap variations of each mistake (every tokenizer kind, every dataset format, every checkpoint file) are tested at
the component level in tests/tune/...; here one case of each kind goes through the recipe.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.recipes.utils import ASSETS, ROOT, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

FULL, LORA = "full_finetune_single_device", "lora_finetune_single_device"
CONFIGS = {FULL: ASSETS / "full_tiny.yaml", LORA: ASSETS / "lora_tiny.yaml"}


def _copy_assets(tiny_assets: Path, tmp_path: Path) -> Path:
    assets = tmp_path / "assets"
    shutil.copytree(tiny_assets, assets, ignore=shutil.ignore_patterns("hf_datasets_cache"))
    return assets


def _run(recipe: str, assets: Path, out: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    overrides = [f"assets_dir={assets}", f"output_dir={out}", *extra]
    return run_recipe(recipe, CONFIGS[recipe], overrides, cwd=cwd, check=False)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line, after checking exit status 1 and no traceback."""
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr[-4000:]
    return errors[0]


def _truncate(path: Path, keep: int = 4000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_truncated_safetensors_in_checkpoint_dir(tiny_assets, tmp_path):
    assets = _copy_assets(tiny_assets, tmp_path)
    weights = assets / "llama" / "model.safetensors"
    _truncate(weights)
    line = _error_line(_run(FULL, assets, tmp_path / "out", cwd=tmp_path))
    assert f"Could not read the safetensors file {weights}" in line and "corrupt or truncated" in line


@pytest.mark.parametrize(
    "recipe, override, expected",
    [
        (FULL, "tokenizer.path={assets}/missing.model", "SentencePiece model not found at '{assets}/missing.model'"),
        (LORA, "tokenizer.path={assets}/train.json", "'{assets}/train.json' is not a valid SentencePiece model"),
    ],
    ids=["missing", "not_a_tokenizer"],
)
def test_bad_tokenizer_path(tiny_assets, tmp_path, recipe, override, expected):
    assets = tiny_assets  # read only
    line = _error_line(_run(recipe, assets, tmp_path / "out", override.format(assets=assets), cwd=tmp_path))
    assert expected.format(assets=assets) in line


def test_dataset_file_that_is_not_json(tiny_assets, tmp_path):
    assets = _copy_assets(tiny_assets, tmp_path)
    rows = json.loads((assets / "train.json").read_text())
    text = "[\n" + ",\n".join(json.dumps(row) for row in rows[:5]) + ",\n" + json.dumps(rows[5])[:30] + "\n"
    (assets / "train.json").write_text(text)  # cut off in row 6 (line 7), as by an interrupted copy
    line = _error_line(_run(FULL, assets, tmp_path / "out", cwd=tmp_path))
    assert f"Dataset file {assets / 'train.json'} is not valid JSON or JSON Lines: line 7" in line


def test_dataset_row_missing_a_column(tiny_assets, tmp_path):
    assets = _copy_assets(tiny_assets, tmp_path)
    rows = json.loads((assets / "train.json").read_text())
    del rows[5]["output"]
    (assets / "train.json").write_text(json.dumps(rows))
    line = _error_line(_run(LORA, assets, tmp_path / "out", cwd=tmp_path))
    assert f"'json:{assets / 'train.json'}', row 5: column 'output' must hold a string" in line
    assert "column 'output' is missing (or null) in this row" in line


# Run under a real file-size limit that starts once the first checkpoint is published: from then on the OS refuses
# (EFBIG) any write past LIMIT bytes, as a full disk refuses any write. SIGXFSZ is ignored so the write fails
# instead of killing the process. Arguments: LIMIT, then `tune` CLI arguments.
_FILE_SIZE_LIMIT_WRAPPER = textwrap.dedent(
    """
    import re, resource, runpy, signal, sys

    limit = int(sys.argv[1])
    sys.argv = ["tune", *sys.argv[2:]]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit_after_first_checkpoint(event, args):
        if event == "os.rename" and re.search(r"step_[0-9]+$", str(args[1])):  # os.replace publishing step_N
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    sys.addaudithook(limit_after_first_checkpoint)
    runpy.run_module("tune._cli.main", run_name="__main__")
    """
)


@pytest.fixture(scope="module")
def failed_save(tiny_assets, tmp_path_factory):
    """A run whose second checkpoint save fails on a full disk: ``(output_dir, process)``."""
    tmp = tmp_path_factory.mktemp("disk_full")
    wrapper = tmp / "limit_file_size.py"
    wrapper.write_text(_FILE_SIZE_LIMIT_WRAPPER)
    out = tmp / "out"
    cmd = [sys.executable, str(wrapper), "100000", "run", FULL, "--config", str(CONFIGS[FULL])]
    cmd += [f"assets_dir={tiny_assets}", f"output_dir={out}", "save_every_n_steps=1"]
    env = {**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{ASSETS}", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    return out, proc


def test_disk_full_during_save_keeps_previous_checkpoint(failed_save, tiny_assets, tmp_path):
    out, proc = failed_save
    line = _error_line(proc)
    assert f"Could not save checkpoint step_2 to output_dir {out}" in line
    assert "File too large" in line  # what the OS said (EFBIG)
    assert f"The previous checkpoint {out / 'step_1'} is intact" in line
    assert "partial checkpoint was removed" in line
    assert sorted(p.name for p in out.iterdir() if p.name.startswith((".tmp", "step_"))) == ["step_1"]
    assert {"model.safetensors", "recipe_state.pt", ".complete"} <= {p.name for p in (out / "step_1").iterdir()}

    # the run resumes from step_1 and finishes
    run = tmp_path / "run"
    shutil.copytree(out, run)
    resumed = _run(FULL, tiny_assets, run, "save_every_n_steps=1", "resume_from_checkpoint=True", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"Resuming from {run / 'step_1'}" in resumed.stderr
    assert [r["step"] for r in read_jsonl(run / "logs" / "log.jsonl") if "loss" in r][-2:] == [2, 3]
    assert (run / "step_3" / ".complete").is_file()


def _corrupt_recipe_state(step: Path) -> str:
    torch.save({"epochs_run": 0, "steps_run": 1, "optimizer": {}}, step / "recipe_state.pt")  # no RNG states
    return f"{step / 'recipe_state.pt'} is not a recipe state this version of tune wrote: it lacks ['rng_state']"


def _truncate_weights(step: Path) -> str:
    _truncate(step / "model.safetensors")
    return f"Could not read the safetensors file {step / 'model.safetensors'}"


@pytest.mark.parametrize("damage", [_truncate_weights, _corrupt_recipe_state], ids=["weights", "recipe_state"])
def test_resume_from_a_damaged_checkpoint(failed_save, tiny_assets, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(failed_save[0], run)
    expected = damage(run / "step_1")
    line = _error_line(_run(FULL, tiny_assets, run, "resume_from_checkpoint=True", cwd=tmp_path))
    assert expected in line
