"""Tests of find_earlier_run / move_earlier_run_aside (tune/training/checkpointing/_layout.py): what in an
output_dir counts as an earlier run, and moving it aside without losing a byte."""

from pathlib import Path

from tune.training.checkpointing import find_earlier_run, move_earlier_run_aside
from tune.training.checkpointing._layout import atomic_checkpoint_dir


def _save(output_dir: Path, name: str, fmt: str = "hf") -> Path:
    with atomic_checkpoint_dir(output_dir, name, {"recipe_state": True, "format": fmt}) as directory:
        (directory / "weights").write_text(name)
    return output_dir / name


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_nothing_written_is_no_earlier_run(tmp_path):
    out = tmp_path / "run"
    assert find_earlier_run(out) == []  # missing
    out.mkdir()
    assert find_earlier_run(out, [out / "logs"]) == []  # empty
    # what a run that failed while loading leaves: an incomplete checkpoint, a temporary directory, and the
    # metric logger's config.json next to an empty log
    (out / "step_1").mkdir()
    (out / "step_1" / "weights").write_text("partial")
    (out / ".tmp_step_2").mkdir()
    (out / "logs").mkdir()
    (out / "logs" / "config.json").write_text('{"batch_size": 4}')
    (out / "logs" / "log.jsonl").write_text("")
    assert find_earlier_run(out, [out / "logs"]) == []
    assert move_earlier_run_aside(out, [out / "logs"]) is None
    assert (out / "step_1" / "weights").read_text() == "partial"


def test_checkpoints_config_and_logs_are_an_earlier_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    _save(out, "step_2")
    _save(out, "epoch_0", fmt="dcp")
    assert find_earlier_run(out) == [out / "step_2", out / "epoch_0"]  # oldest first, whatever their format
    sharded = tmp_path / "sharded"
    (sharded / "dcp").mkdir(parents=True)
    _save(sharded / "dcp", "step_1", fmt="dcp")  # a distributed run's sharded state
    assert find_earlier_run(sharded) == [sharded / "dcp" / "step_1"]

    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.yaml").write_text("batch_size: 4\n")
    assert find_earlier_run(config_only) == [config_only / "config.yaml"]

    logs_only = tmp_path / "logs_only"
    (logs_only / "logs" / "tb").mkdir(parents=True)
    (logs_only / "logs" / "tb" / "events").write_text("x")
    assert find_earlier_run(logs_only, [logs_only / "logs"]) == [logs_only / "logs"]
    # a log directory outside output_dir is not looked at (runs may share one); one equal to it is
    assert find_earlier_run(logs_only / "logs", [logs_only]) == []
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "log_1.jsonl").write_text('{"step": 1}\n')
    assert find_earlier_run(flat, [flat]) == [flat / "log_1.jsonl"]


def test_move_aside_keeps_every_byte_and_frees_the_layout(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    _save(out, "step_1")
    _save(out, "step_2")
    (out / "dcp").mkdir()
    _save(out / "dcp", "step_2", fmt="dcp")
    (out / "step_3").mkdir()  # incomplete: moved too, so the new run's step_3 cannot meet it
    (out / "step_3" / "weights").write_text("partial")
    (out / "config.yaml").write_text("batch_size: 4\n")
    (out / "logs").mkdir()
    (out / "logs" / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (out / "notes.txt").write_text("the user's own file")
    before = _files(out)

    aside = move_earlier_run_aside(out, [out / "logs", tmp_path / "elsewhere"])

    assert aside is not None and aside.parent == out and aside.name.startswith("overwritten_")
    assert find_earlier_run(out, [out / "logs"]) == []
    assert sorted(p.name for p in out.iterdir()) == sorted(["notes.txt", aside.name])
    moved = {f"{aside.name}/{name}": data for name, data in before.items() if name != "notes.txt"}
    assert _files(out) == {"notes.txt": before["notes.txt"], **moved}
    # a second overwrite within the same second gets a directory of its own
    _save(out, "step_1")
    second = move_earlier_run_aside(out)
    assert second is not None and second != aside and (second / "step_1" / "weights").read_text() == "step_1"
