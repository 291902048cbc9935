"""A second training run into an output_dir that holds an earlier run: refused (one line, nothing touched) unless
it resumes (``resume_from_checkpoint=True``) or opts in (``overwrite_output_dir=True``: the earlier run is moved
into ``output_dir/overwritten_<time>/``). tune/config/_io.py ``check_output_dir``, called by ``config.parse``."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import ASSETS, loss_records, run_recipe
from tune.config import ConfigError, check_output_dir

pytestmark = pytest.mark.integration

RECIPE = "full_finetune_single_device"
CONFIG = ASSETS / "full_tiny.yaml"


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", "max_steps_per_epoch=2", *extra]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_run_into_the_same_output_dir_is_refused_and_touches_nothing(tiny_assets, tmp_path):
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out), cwd=tmp_path)
    first = _files(out)
    assert "config.yaml" in first and "step_2/.complete" in first and "logs/log.jsonl" in first

    # before: exit 0, step_2/ and config.yaml replaced, two runs' losses in one log
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "optimizer.lr=1e-2"), cwd=tmp_path, check=False)

    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [
        # `tune run` checks before the recipe starts (the recipe's own check says the same, as "<recipe>.py: error:")
        f"tune: error: output_dir: {out} holds the outputs of an earlier run (step_2, config.yaml, logs); "
        "resume that run with resume_from_checkpoint=True, choose another output_dir, or set "
        f"overwrite_output_dir=True to move the earlier run's outputs into {out}/overwritten_<time>/ and start afresh."
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _files(out) == first  # byte for byte


def test_distributed_run_is_refused_in_one_line(tiny_assets, tmp_path):
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out), cwd=tmp_path)
    first = _files(out)

    proc = run_distributed("full_finetune_distributed", CONFIG, _overrides(tiny_assets, out), cwd=tmp_path, check=False)

    assert proc.returncode == 1
    # refused by the launching process before torchrun starts a rank: one line, as on one device
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == [
        line for line in proc.stderr.splitlines() if line.startswith(f"tune: error: output_dir: {out} holds")
    ]
    assert f"tune: error: output_dir: {out} holds the outputs of an earlier run" in proc.stderr
    assert "rank" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _files(out) == first


def test_overwrite_output_dir_moves_the_earlier_run_aside(tiny_assets, tmp_path):
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out), cwd=tmp_path)
    first = _files(out)

    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "overwrite_output_dir=True"), cwd=tmp_path)

    (aside,) = out.glob("overwritten_*")
    assert f"moved the earlier run's outputs in {out} into {aside}" in proc.stderr
    assert _files(aside) == first  # the earlier run, whole
    assert [r["step"] for r in loss_records(out)] == [1, 2]  # the new run's log holds the new run only
    assert (out / "step_2" / ".complete").is_file() and (out / "config.yaml").is_file()


def test_resuming_and_a_run_that_wrote_nothing_are_not_refused(tiny_assets, tmp_path):
    # a run that fails while loading the weights leaves only the logger's config.json and an empty log
    out = tmp_path / "run"
    failed = run_recipe(
        RECIPE,
        CONFIG,
        _overrides(tiny_assets, out, "checkpointer.checkpoint_files=[missing.safetensors]"),
        cwd=tmp_path,
        check=False,
    )
    assert failed.returncode != 0 and "earlier run" not in failed.stderr
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "save_every_n_steps=1"), cwd=tmp_path)
    # resuming continues the earlier run in place, from its newest checkpoint holding the training state (step_1)
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "resume_from_checkpoint=True"), cwd=tmp_path)
    assert [r["step"] for r in loss_records(out)] == [1, 2, 2]


def test_check_output_dir_reads_the_config(tmp_path):
    out = tmp_path / "run"
    (out / "elsewhere").mkdir(parents=True)
    (out / "elsewhere" / "log.jsonl").write_text('{"step": 1}\n')
    cfg = OmegaConf.create(
        {
            "output_dir": str(out),
            "resume_from_checkpoint": False,
            "metric_logger": {"_component_": "x", "log_dir": "${output_dir}/elsewhere"},
        }
    )
    with pytest.raises(ConfigError, match=r"earlier run \(elsewhere\)"):
        check_output_dir(cfg)
    # a recipe without resume_from_checkpoint (generate, eval, quantize) is never checked
    assert check_output_dir(OmegaConf.create({"output_dir": str(out)})) is None
    # checkpoints written to checkpointer.output_dir count as well
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text("a: 1\n")
    cfg = OmegaConf.create(
        {
            "output_dir": str(tmp_path / "new"),
            "resume_from_checkpoint": False,
            "checkpointer": {"output_dir": str(ckpt)},
        }
    )
    with pytest.raises(ConfigError, match=r"^checkpointer.output_dir: \S+ckpt holds the outputs of an earlier run \("):
        check_output_dir(cfg)
    cfg.overwrite_output_dir = True
    aside = check_output_dir(cfg)
    assert aside is not None and (aside / "config.yaml").read_text() == "a: 1\n"


def test_checkpoints_of_a_second_model_inside_output_dir_count_and_move(tmp_path):
    # PPO: the value model's checkpointer writes to output_dir/value
    from tune.training.checkpointing._layout import atomic_checkpoint_dir

    out = tmp_path / "run"
    (out / "value").mkdir(parents=True)
    with atomic_checkpoint_dir(out / "value", "step_1", {"format": "hf", "recipe_state": False}) as directory:
        (directory / "weights").write_text("value model")
    cfg = OmegaConf.create(
        {
            "output_dir": str(out),
            "resume_from_checkpoint": False,
            "checkpointer": {"output_dir": "${output_dir}"},
            "value_checkpointer": {"output_dir": "${output_dir}/value"},
        }
    )
    with pytest.raises(ConfigError, match=r"^output_dir: \S+ holds the outputs of an earlier run \(value/step_1\)"):
        check_output_dir(cfg)
    cfg.overwrite_output_dir = True
    aside = check_output_dir(cfg)
    assert aside is not None and aside.parent == out
    assert (aside / "value" / "step_1" / "weights").read_text() == "value model"
    assert not (out / "value" / "step_1").exists()
