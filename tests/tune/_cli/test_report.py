"""`tune report` and the end of `tune run`: the HTML report of runs (tune/training/_report.py, tune/_cli/_report.py).

The integration tests train two tiny runs (tests/recipes/utils.py's assets): full fine-tuning with validation,
run as a user would (a fresh `tune run` whose stderr is a file: its progress bar must give one line per step), and
LoRA DPO with validation. Each report is parsed back and compared with the run's own JSON Lines log: one chart
series per logged metric and run, with one point per logged step.
"""

import json
import math
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tune._cli._run import report_run
from tune.training import RunLogError, read_run_log, write_report

REPO = Path(__file__).resolve().parents[3]
RECIPE_ASSETS = REPO / "tests" / "recipes" / "assets"
SFT_STEPS, DPO_STEPS = 6, 4


class _Report(HTMLParser):
    """The parts of a report page the tests read: charts, their series, the runs table, and every tag name."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.charts: list[dict] = []  # {"metrics": [...], "series": [{run, metric, points, coords}]}
        self.runs: list[dict] = []  # the runs table's rows: {"name": data-run, "cells": texts after the name}
        self.tags: set[str] = set()
        self._table, self._row, self._cell = None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "figure":
            self.charts.append({"metrics": attrs["data-metrics"].split(), "series": []})
        elif tag == "polyline":
            coords = [tuple(map(float, p.split(","))) for p in attrs["points"].split()]
            series = dict(run=attrs["data-run"], metric=attrs["data-metric"], points=int(attrs["data-points"]))
            self.charts[-1]["series"].append({**series, "coords": coords})
        elif tag == "table":
            self._table = attrs.get("class")
        elif tag == "tr" and self._table == "runs" and "data-run" in attrs:
            self.runs.append({"name": attrs["data-run"], "cells": []})
            self._row = self.runs[-1]["cells"]
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def series(self) -> dict[tuple[str, str], dict]:
        return {(s["run"], s["metric"]): s for chart in self.charts for s in chart["series"]}


def _logged(log: Path) -> dict[str, dict[int, float]]:
    """Metric -> step -> value, read from a JSON Lines log here (the later record of a step wins)."""
    metrics: dict[str, dict[int, float]] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.setdefault(key, {})[record["step"]] = value
    return metrics


def _check_report_matches_log(report: _Report, run: str, log: Path) -> dict[str, dict[int, float]]:
    logged = _logged(log)
    series = {metric: s for (name, metric), s in report.series().items() if name == run}
    assert sorted(series) == sorted(logged)  # a series for every metric the run logged, and nothing else
    for metric, values in logged.items():
        finite = [v for v in values.values() if math.isfinite(v)]
        assert series[metric]["points"] == len(finite) == len(series[metric]["coords"]), metric
    return logged


# ------------------------------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    from tests.recipes.utils import build_tiny_assets

    root = tmp_path_factory.mktemp("report_assets")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_CACHE", str(root / "hf_datasets_cache"))  # as tests/recipes/conftest.py does
        yield build_tiny_assets(root)


@pytest.fixture(scope="module")
def sft_run(tiny_assets, tmp_path_factory):
    """Full fine-tuning with validation every 3 steps, in a fresh `tune run` whose stderr is a file."""
    root = tmp_path_factory.mktemp("sft")
    out = root / "run"
    overrides = [
        f"assets_dir={tiny_assets}", f"output_dir={out}", f"max_steps_per_epoch={SFT_STEPS}",
        "log_peak_memory_stats=True", "run_val_every_n_steps=3",
        "dataset_val={_component_: tune.datasets.alpaca_dataset, source: json, split: train, "
        f"data_files: {tiny_assets}/val.json, train_on_input: false}}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(RECIPE_ASSETS)]), OMP_NUM_THREADS="1")
    env["HF_DATASETS_CACHE"] = str(tiny_assets / "hf_datasets_cache")
    config = RECIPE_ASSETS / "full_tiny.yaml"
    cmd = [sys.executable, "-m", "tune._cli.main", "run", "full_finetune_single_device", "--config", str(config)]
    with open(root / "stderr.log", "w") as stderr:
        proc = subprocess.run(
            [*cmd, *overrides], cwd=root, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300
        )
    assert proc.returncode == 0, (root / "stderr.log").read_text()[-4000:]
    return out, proc.stdout, (root / "stderr.log").read_text()


@pytest.fixture(scope="module")
def dpo_run(tiny_assets, tmp_path_factory):
    """LoRA DPO with validation every 2 steps (through tests/recipes/utils.py run_recipe, as the recipe tests)."""
    from tests.recipes._preference_assets import write_preference_messages
    from tests.recipes.utils import run_recipe

    root = tmp_path_factory.mktemp("dpo")
    train = write_preference_messages(root / "train.json", 8 * DPO_STEPS, seed=0)
    held_out = write_preference_messages(root / "held_out.json", 6, seed=1)
    out = root / "run"
    overrides = [
        f"assets_dir={tiny_assets}", f"output_dir={out}", f"dataset.data_files={train}",
        f"max_steps_per_epoch={DPO_STEPS}", "run_val_every_n_steps=2",
        "dataset_val={_component_: tune.datasets.preference_dataset, source: json, split: train, "
        f"data_files: {held_out}}}",
    ]  # fmt: skip
    proc = run_recipe("lora_dpo_single_device", RECIPE_ASSETS / "lora_dpo_tiny.yaml", overrides, cwd=root)
    return out, proc.stdout


@pytest.mark.integration
def test_a_finished_run_writes_its_report_and_says_where_its_log_is(sft_run):
    out, stdout, stderr = sft_run
    log = out / "logs" / "log.jsonl"
    assert f"Metrics logged to {log}" in stdout
    assert f"Report: {out / 'logs' / 'report.html'} (rebuild it with `tune report {out}`" in stdout
    report = _Report((out / "logs" / "report.html").read_text())
    logged = _check_report_matches_log(report, "run", log)
    # what the recipe logs: step metrics with peak memory, and validation every 3 steps
    assert {"loss", "lr", "tokens_per_second", "grad_norm", "peak_memory_rss", "val_loss"} <= set(logged)
    assert sorted(logged["loss"]) == list(range(1, SFT_STEPS + 1)) and sorted(logged["val_loss"]) == [3, 6]
    assert report.charts[0]["metrics"] == ["loss", "val_loss"]  # loss first, validation with it
    assert sum(len(c["series"]) for c in report.charts) == len(logged)
    assert not report.tags & {"script", "img", "link", "iframe"}  # self-contained: nothing runs, nothing fetched

    (row,) = report.runs
    assert row["name"] == "run" and row["cells"][0] == f"run{out}"  # the name, and the directory under it
    header = dict(zip(["recipe", "config", "model", "steps", "final loss", "best val loss"], row["cells"][1:]))
    assert header["recipe"] == "full_finetune_single_device"
    assert header["config"].endswith("full_tiny.yaml") and header["model"] == "llama2 (llama)"
    assert header["steps"] == str(SFT_STEPS)
    best_step = min(logged["val_loss"], key=logged["val_loss"].get)
    assert header["best val loss"] == f"{logged['val_loss'][best_step]:.4g} (step {best_step})"
    assert header["final loss"] == f"{logged['loss'][SFT_STEPS]:.4g}"
    (entry,) = json.loads((out / "logs" / "run.json").read_text())["runs"]
    assert entry["recipe"] == "full_finetune_single_device" and entry["wall_seconds"] > 0
    assert f"output_dir={out}" in entry["overrides"]


@pytest.mark.integration
def test_the_progress_bar_of_a_redirected_run_writes_one_line_per_step(sft_run):
    _, _, stderr = sft_run
    assert "\r" not in stderr
    bar = [line for line in stderr.splitlines() if re.match(r"1\|\d+\|Loss: ", line)]
    assert len(bar) == SFT_STEPS, stderr[-3000:]
    steps = [int(re.search(rf" (\d+)/{SFT_STEPS} \[", line).group(1)) for line in bar]
    assert steps == list(range(1, SFT_STEPS + 1))
    assert [int(line.split("|")[1]) for line in bar] == steps  # each line names its own step's loss


@pytest.mark.integration
def test_tune_report_of_a_dpo_run_charts_every_preference_metric(dpo_run, tune, tmp_path):
    out, stdout = dpo_run
    assert "Report: " in stdout
    code, printed, err = tune("report", str(out), "--out", str(tmp_path / "dpo.html"))
    assert code == 0, err
    assert printed.startswith(f"Wrote {tmp_path / 'dpo.html'}: 1 run, ")
    report = _Report((tmp_path / "dpo.html").read_text())
    logged = _check_report_matches_log(report, "run", out / "logs" / "log.jsonl")
    reward_metrics = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"}
    assert reward_metrics | {f"val_{m}" for m in reward_metrics} | {"loss", "val_loss"} <= set(logged)
    assert sorted(logged["val_rewards/accuracies"]) == [2, 4] and sorted(logged["loss"]) == [1, 2, 3, 4]
    charts = {tuple(c["metrics"]) for c in report.charts}
    assert ("rewards/accuracies", "val_rewards/accuracies") in charts and ("loss", "val_loss") in charts
    assert report.runs[0]["cells"][1] == "lora_dpo_single_device"


@pytest.mark.integration
def test_several_runs_overlay_one_line_each(sft_run, dpo_run, tune, tmp_path):
    sft_out, dpo_out = sft_run[0], dpo_run[0]
    code, printed, err = tune("report", str(sft_out), str(dpo_out), "--out", str(tmp_path / "both.html"))
    assert code == 0, err
    report = _Report((tmp_path / "both.html").read_text())
    names = [row["name"] for row in report.runs]  # both directories are named `run`: their parents tell them apart
    assert [n.split("/")[-2] for n in names] == [sft_out.parent.name, dpo_out.parent.name]
    _check_report_matches_log(report, names[0], sft_out / "logs" / "log.jsonl")
    _check_report_matches_log(report, names[1], dpo_out / "logs" / "log.jsonl")
    loss = next(c for c in report.charts if c["metrics"][0] == "loss")
    assert {(s["run"], s["metric"]) for s in loss["series"]} == {(n, m) for n in names for m in ("loss", "val_loss")}
    shared = next(c for c in report.charts if c["metrics"] == ["lr"])
    assert len(shared["series"]) == 2


# ------------------------------------------------------------------------------------------------ no run needed


def _write_run(out: Path, records: list[dict], extra_config: str = "") -> Path:
    (out / "logs").mkdir(parents=True)
    (out / "config.yaml").write_text(
        f"output_dir: {out}\nmodel:\n  _component_: tune.models.qwen2_5.lora_qwen2_5_0_5b\n"
        f"metric_logger:\n  _component_: tune.training.metric_logging.DiskLogger\n  log_dir: {out}/logs\n"
        + extra_config
    )
    (out / "logs" / "log_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


def test_a_directory_without_a_log_is_one_clear_error_line(tune, tmp_path):
    code, _, err = tune("report", str(tmp_path / "missing"))
    assert code == 1 and err == f"tune: error: {tmp_path / 'missing'} does not exist: pass a run's output_dir " + (
        "(the directory holding config.yaml and logs/)\n"
    )
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    code, _, err = tune("report", str(tmp_path / "empty"))
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"tune: error: no metric log (*.jsonl) in {tmp_path / 'empty'}/logs, {tmp_path / 'empty'}:")
    assert "tune.training.metric_logging.DiskLogger" in err


def test_a_resumed_log_keeps_the_later_value_of_each_step_and_skips_cut_lines(tmp_path):
    out = _write_run(tmp_path / "run", [{"step": s, "time": 100.0 + s, "loss": 2.0 - s / 10} for s in (1, 2, 3)])
    # the resumed run (from step 2) writes a second file, and the first file ends with a line cut short
    with open(out / "logs" / "log_1.jsonl", "a") as f:
        f.write('{"step": 4, "lo')
    second = [{"step": s, "time": 200.0 + s, "loss": 1.0 - s / 10} for s in (3, 4)]
    (out / "logs" / "log_2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in second))
    run = read_run_log(out)
    assert run.metrics["loss"] == {1: 1.9, 2: 1.8, 3: 0.7, 4: 0.6}
    assert run.skipped_lines == 1 and [f.name for f in run.log_files] == ["log_1.jsonl", "log_2.jsonl"]
    assert run.summary()["final loss"] == "0.6" and run.summary()["model"] == "lora_qwen2_5_0_5b"


def test_a_moved_run_a_log_directory_and_a_log_file_read_the_same(tmp_path):
    out = _write_run(tmp_path / "before", [{"step": s, "loss": 1.0 / s} for s in (1, 2)])
    moved = out.rename(tmp_path / "after")  # config.yaml still names the old directory
    for path in (moved, moved / "logs", moved / "logs" / "log_1.jsonl"):
        assert read_run_log(path).metrics == {"loss": {1: 1.0, 2: 0.5}}, path


def test_a_log_directory_outside_the_output_dir_leaves_the_report_in_the_output_dir(tmp_path):
    out, shared = tmp_path / "run", tmp_path / "all_logs"  # a log directory several runs may share
    out.mkdir()
    shared.mkdir()
    (out / "config.yaml").write_text(f"output_dir: {out}\nmetric_logger:\n  log_dir: {shared}\n")
    (shared / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    run = read_run_log(out)
    assert run.metrics == {"loss": {1: 0.5}} and run.report_dir == out
    assert write_report([run]) == out / "report.html"


def test_non_finite_values_and_long_runs_are_drawn_from_what_can_be(tmp_path):
    records = [{"step": s, "loss": math.sin(s / 300)} for s in range(1, 5001)]
    records[10]["loss"] = float("nan")
    out = _write_run(tmp_path / "run", records)
    assert write_report([out]) == out / "logs" / "report.html"  # beside the log, as `tune run` writes it
    report = _Report((out / "logs" / "report.html").read_text())
    (series,) = report.series().values()
    assert series["points"] == 4999 and len(series["coords"]) <= 1500  # bucket minima and maxima
    assert all(12 <= y <= 222 for _, y in series["coords"])  # inside the plot area (top 12, height 210)
    assert "(+1 nan/inf, not drawn)" in (out / "logs" / "report.html").read_text()


def test_the_end_of_run_report_never_fails_the_run(tmp_path, capsys):
    out = _write_run(tmp_path / "run", [{"step": 1, "loss": 1.0}], "resume_from_checkpoint: true\n")
    config = ["--config", str(out / "config.yaml")]
    report_run("lora_finetune_single_device", ["--config", "my.yaml", "batch_size=2"], config, started=0.0)
    assert "Report: " in capsys.readouterr().out
    report_run("lora_finetune_single_device", ["--config", "my.yaml"], config, started=0.0)  # a resumed run
    capsys.readouterr()
    runs = json.loads((out / "logs" / "run.json").read_text())["runs"]
    assert [r["overrides"] for r in runs] == [["batch_size=2"], []] and runs[0]["config"] == "my.yaml"
    assert read_run_log(out).summary()["run time"].endswith("(2 invocations)")

    (out / "logs" / "report.html").unlink()
    (out / "logs" / "report.html").mkdir()  # cannot be replaced by a file
    report_run("lora_finetune_single_device", ["--config", "my.yaml"], config, started=0.0)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("tune: warning: could not write the run's report: ")
    assert f"`tune report {out}` retries." in captured.err

    plain = tmp_path / "generate"
    plain.mkdir()
    (plain / "config.yaml").write_text(f"output_dir: {plain}\n")
    report_run("generate", ["--config", "x.yaml"], ["--config", str(plain / "config.yaml")], started=0.0)
    assert capsys.readouterr() == ("", "") and sorted(p.name for p in plain.iterdir()) == ["config.yaml"]


def test_run_log_error_is_a_user_error():
    from tune.utils import TuneError

    assert issubclass(RunLogError, TuneError)
