"""Bad input through `tune run`: each user mistake is one `error:` line naming the file, exit status 1, no traceback,
and a write that fails (a full disk) leaves what was written before intact and the run resumable: a checkpoint, the
sharded state of a distributed run, the metric log, the config copy in output_dir, a quantised model, eval results.

Cheap variations of each mistake (every tokenizer kind, every dataset format, every checkpoint file) are tested at
the component level in tests/tune/...; here one case of each kind goes through the recipe.
"""

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import ASSETS, loss_records, read_jsonl, run_recipe

pytestmark = pytest.mark.integration

FULL, LORA = "full_finetune_single_device", "lora_finetune_single_device"
DIST, QUANTIZE, EVAL = "full_finetune_distributed", "quantize", "eleuther_eval"
CONFIGS = {
    FULL: ASSETS / "full_tiny.yaml",
    LORA: ASSETS / "lora_tiny.yaml",
    QUANTIZE: ASSETS / "quantize_tiny.yaml",
    EVAL: ASSETS / "eval_tiny.yaml",
}


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


# A full disk is a real file-size limit (RLIMIT_FSIZE) that the run sets itself, from a chosen moment on: the config
# imports tests/recipes/assets/disk_full.py (in every process of a distributed run), which reads when and how much
# from TUNE_TEST_DISK_FULL ("EVENT PATTERN LIMIT", see that file). The OS then refuses (EFBIG, "File too large") any
# write past LIMIT bytes, as a full disk refuses any write.
def _run_on_full_disk(recipe: str, assets: Path, out: Path, disk_full: str, *extra: str, cwd: Path):
    overrides = [f"assets_dir={assets}", f"output_dir={out}", "imports=[disk_full]", *extra]
    env = {"TUNE_TEST_DISK_FULL": disk_full}
    return run_recipe(recipe, CONFIGS[recipe], overrides, cwd=cwd, check=False, env=env)


def _checkpoints(out: Path) -> list[str]:
    """The checkpoint directories in ``out``, temporary ones included."""
    return sorted(p.name for p in out.iterdir() if p.name.startswith((".tmp", ".old", "step_")))


def _assert_complete(step: Path) -> None:
    assert (step / ".complete").is_file() and (step / "recipe_state.pt").is_file(), sorted(step.iterdir())


@pytest.fixture(scope="module")
def failed_save(tiny_assets, tmp_path_factory):
    """A run whose second checkpoint save fails on a full disk: ``(output_dir, process)``."""
    tmp = tmp_path_factory.mktemp("disk_full")
    out = tmp / "out"
    # from the publication of the first checkpoint (os.replace to step_N) on, no file may grow past 100 kB
    proc = _run_on_full_disk(FULL, tiny_assets, out, "os.rename step_[0-9]+$ 100000", "save_every_n_steps=1", cwd=tmp)
    return out, proc


def test_disk_full_during_save_keeps_previous_checkpoint(failed_save, tiny_assets, tmp_path):
    out, proc = failed_save
    line = _error_line(proc)
    assert f"Could not save checkpoint step_2 to output_dir {out}" in line
    assert "File too large" in line  # what the OS said (EFBIG)
    assert f"The previous checkpoint {out / 'step_1'} is intact" in line
    assert "partial checkpoint was removed" in line
    assert _checkpoints(out) == ["step_1"]
    assert {"model.safetensors", "recipe_state.pt", ".complete"} <= {p.name for p in (out / "step_1").iterdir()}

    # the run resumes from step_1 and finishes
    run = tmp_path / "run"
    shutil.copytree(out, run)
    resumed = _run(FULL, tiny_assets, run, "save_every_n_steps=1", "resume_from_checkpoint=True", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"Resuming from {run / 'step_1'}" in resumed.stderr
    assert [r["step"] for r in loss_records(run)][-2:] == [2, 3]
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


def test_disk_full_while_logging_stops_the_run_and_keeps_the_log(tiny_assets, tmp_path):
    out = tmp_path / "out"
    log = out / "logs" / "log.jsonl"
    # once step_1 is published, the log may grow by 40 bytes: step 2's line is cut off part-way
    proc = _run_on_full_disk(
        FULL, tiny_assets, out, f"os.rename step_1$ {log}+40", "save_every_n_steps=1", cwd=tmp_path
    )
    line = _error_line(proc)
    assert f"Could not write the metric log {log}: [Errno 27] File too large" in line
    assert "The run stopped at step 2 rather than train on without its metrics" in line
    assert "checkpoints saved so far are complete" in line and "resume_from_checkpoint=True" in line
    assert [r["step"] for r in read_jsonl(log)] == [1]  # the part of step 2's line that was written is gone
    assert _checkpoints(out) == ["step_1"]
    _assert_complete(out / "step_1")

    # the run resumes from step_1, appending to the same log
    resumed = _run(FULL, tiny_assets, out, "save_every_n_steps=1", "resume_from_checkpoint=True", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [r["step"] for r in read_jsonl(log)] == [1, 2, 3]


def test_disk_full_while_saving_the_config_keeps_the_previous_one(failed_save, tiny_assets, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(failed_save[0], run)
    before = (run / "config.yaml").read_bytes()
    # a resumed run writes output_dir/config.yaml at the end of its setup: the disk is full from then on
    disk_full = f"open ^{re.escape(str(run))}/\\.config\\. 0"  # the temporary file written, then renamed
    extra = ["save_every_n_steps=1", "resume_from_checkpoint=True"]
    line = _error_line(_run_on_full_disk(FULL, tiny_assets, run, disk_full, *extra, cwd=tmp_path))
    assert f"Could not write the run's config {run / 'config.yaml'}: [Errno 27] File too large" in line
    assert f"The file keeps its previous content (if any) and the checkpoints in {run} are as they were" in line
    assert (run / "config.yaml").read_bytes() == before
    assert not [p.name for p in run.iterdir() if p.name.startswith(".config")]  # no temporary file left behind
    assert _checkpoints(run) == ["step_1"]

    resumed = _run(FULL, tiny_assets, run, *extra, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"Resuming from {run / 'step_1'}" in resumed.stderr
    assert (run / "step_3" / ".complete").is_file()


@pytest.mark.slow  # 2 gloo ranks, a sharded save (~17 s); rank zero's disk-full cases run in the default tier
def test_disk_full_on_one_rank_during_a_sharded_save(tiny_assets, tmp_path, monkeypatch):
    out = tmp_path / "out"
    common = [f"assets_dir={tiny_assets}", f"output_dir={out}", "batch_size=2", "save_every_n_steps=1"]
    # rank 1 cannot write its shard of step_2 (dcp/.tmp_step_2/__1_0.distcp); rank 0 writes its own
    monkeypatch.setenv("TUNE_TEST_DISK_FULL", r"open dcp/\.tmp_step_2/__1_ 0")
    proc = run_distributed(DIST, CONFIGS[FULL], [*common, "imports=[disk_full]"], cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-8000:]
    # every rank stops at the same point with the same error (none waits for the other); rank 0 alone prints it, as
    # one line, then torchrun's summary of the exit codes
    # `tune run` reports the first rank that failed, once, in one line
    errors = re.findall(r"tune: error: rank \d+ failed: .*", proc.stderr)
    assert len(errors) == 1, proc.stderr[-8000:]
    line = errors[0]
    assert f"Could not save checkpoint step_2 to output_dir {out / 'dcp'}: rank 1: [Errno 27] File too large" in line
    assert f"The previous checkpoint {out / 'dcp' / 'step_1'} is intact" in line
    assert "partial checkpoint was removed" in line
    assert _checkpoints(out / "dcp") == ["step_1"] and (out / "dcp" / "step_1" / ".complete").is_file()
    assert _checkpoints(out) == ["step_1"]  # the gathered model of step 2 comes after the sharded state: not written

    monkeypatch.delenv("TUNE_TEST_DISK_FULL")
    resumed = run_distributed(DIST, CONFIGS[FULL], [*common, "resume_from_checkpoint=True"], cwd=tmp_path)
    assert f"Resumed from {out / 'dcp' / 'step_1'} after 1 optimizer steps" in resumed.stderr
    assert [r["step"] for r in loss_records(out)][-2:] == [2, 3]
    assert (out / "step_3" / ".complete").is_file()


def test_disk_full_while_saving_the_quantised_model(tiny_assets, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    model = out / "model_int8dynactint4weight.pt"
    model.write_bytes(b"the model an earlier run saved")
    # from the read of the checkpoint's config.json on, no file may grow past 100 kB (the quantised model: 570 kB)
    disk_full = r"open /llama/config\.json$ 100000"
    line = _error_line(_run_on_full_disk(QUANTIZE, tiny_assets, out, disk_full, cwd=tmp_path))
    assert f"Could not write the quantised model {model}: " in line  # torch.save: "unexpected pos ..."
    assert f"A {model.name} written before is as it was" in line
    assert sorted(p.name for p in out.iterdir()) == [model.name]  # no temporary file left behind
    assert model.read_bytes() == b"the model an earlier run saved"


def test_disk_full_while_writing_the_eval_results(tiny_assets, tmp_path):
    pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("\n".join(json.dumps({"question": f"{a} + 1 =", "label": 0}) for a in range(4)))
    (tasks / "tiny_mc.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: tiny_mc
            dataset_path: json
            dataset_kwargs:
              data_files:
                test: {tasks / "docs.jsonl"}
            test_split: test
            output_type: multiple_choice
            doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
            doc_to_choice: ["yes", "no"]
            doc_to_target: "{{{{label}}}}"
            metric_list:
              - metric: acc
            """
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    results = out / "eleuther_eval_results.json"
    results.write_text('{"an earlier run": 1}')
    disk_full = r"open /\.?eleuther_eval_results\.json(\.tmp)?$ 0"
    extra = [f"include_path={tasks}", "tasks=[tiny_mc]"]
    proc = _run_on_full_disk(EVAL, tiny_assets, out, disk_full, *extra, cwd=tmp_path)
    line = _error_line(proc)
    assert f"Could not write the results {results}: [Errno 27] File too large" in line
    assert "The table above holds them" in line and "tiny_mc" in proc.stdout
    assert results.read_text() == '{"an earlier run": 1}'
    assert sorted(p.name for p in out.iterdir()) == [results.name]


@pytest.mark.parametrize(
    "what",
    [  # one write in the default tier (2 gloo ranks each, ~8 s); the others are the same path
        "config",
        pytest.param("metric_log", marks=pytest.mark.slow),
        pytest.param("gathered_model", marks=pytest.mark.slow),
    ],
)
def test_disk_full_on_rank_zero_alone_stops_every_rank_with_one_line(tiny_assets, tmp_path, monkeypatch, what):
    # rank 0 alone writes these; it shares the failure (tune.training.errors_on_all_ranks), so every rank stops there
    # with the same error, which rank 0 alone prints
    out = tmp_path / "out"
    if what == "metric_log":  # after step_1, rank 0's log line of step 2 is cut off
        disk_full, expected = f"os.rename ^{re.escape(str(out))}/step_1$ {out}/logs/log.jsonl+40", "metric log"
    elif what == "gathered_model":  # the sharded state of step 2 is saved, then rank 0 cannot write the gathered model
        disk_full, expected = f"os.rename ^{re.escape(str(out))}/dcp/step_2$ 100000", "Could not save checkpoint step_2"
    else:  # the run's config, written at the end of setup
        disk_full, expected = f"open ^{re.escape(str(out))}/\\.config\\. 0", f"Could not write the run's config {out}"
    monkeypatch.setenv("TUNE_TEST_DISK_FULL", disk_full)
    overrides = [f"assets_dir={tiny_assets}", f"output_dir={out}", "batch_size=2", "save_every_n_steps=1"]
    proc = run_distributed(DIST, CONFIGS[FULL], [*overrides, "imports=[disk_full]"], cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "terminate called" not in proc.stderr, proc.stderr[-8000:]
    # `tune run` reports the first rank that failed, once, in one line
    errors = re.findall(r"tune: error: rank \d+ failed: .*", proc.stderr)
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-8000:]
    if what != "config":
        assert (out / "dcp" / "step_1" / ".complete").is_file()


def test_an_error_on_one_other_rank_alone_is_named_in_torchruns_summary(tiny_assets, tmp_path, monkeypatch):
    # rank 1 alone stops with a TuneError (as for a file missing on one node only): rank 0 prints nothing of its own,
    # so the cause reaches the user through torchrun's summary of the first rank to fail (its error file)
    (tmp_path / "only_rank_one.py").write_text(
        "import os\n"
        "from tune.utils import TuneError\n"
        "if os.environ.get('RANK') == '1':\n"
        "    raise TuneError('the data disk is missing on this node')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={tmp_path / 'out'}",
        "batch_size=2",
        "imports=[only_rank_one]",
    ]
    proc = run_distributed(DIST, CONFIGS[FULL], overrides, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-8000:]
    assert "TuneError: the data disk is missing on this node" in proc.stderr, proc.stderr[-8000:]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("dtype=bfloat32", "dtype = 'bfloat32': must be one of fp32, bf16, fp16, fp64"),
        ("dataset.packed=maybe", "dataset.packed = 'maybe': must be true or false"),
    ],
    ids=["dtype", "packed"],
)
def test_bad_values_are_refused_before_the_recipe_starts(tiny_assets, tmp_path, override, expected):
    # the whole process: exit status 1, one error line, no traceback, nothing written to output_dir
    out = tmp_path / "out"
    line = _error_line(_run(FULL, tiny_assets, out, override, cwd=tmp_path))
    assert line.startswith(f"tune: error: {CONFIGS[FULL]}: {expected}"), line
    assert not out.exists()
