"""`tune run [TORCHRUN FLAGS] RECIPE --config CONFIG [key=value ...]` (tune/_cli/_run.py)."""

import json
import sys
from pathlib import Path

import pytest

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "cli" / "shipped"


def _result(out_dir):
    return json.loads((out_dir / "result.json").read_text())


def test_runs_a_builtin_recipe_in_process_with_overrides(tune, shipped, tmp_path):
    out_dir = tmp_path / "out"
    argv, path = list(sys.argv), list(sys.path)
    code, _, err = tune(
        "run",
        "echo_single_device",
        "--config",
        "toy/tiny_echo",
        f"output_dir={out_dir}",
        "message=a=b",
        "scaler.offset=1",
    )
    assert code == 0, err
    result = _result(out_dir)
    assert result["argv0"] == str(shipped / "recipes" / "echo_single_device.py")  # as `python recipe.py` sees it
    assert result["message"] == "a=b"
    assert result["scaled"] == [3.0, 5.0]  # [1, 2] * factor 2 + offset 1
    assert (sys.argv, sys.path) == (argv, path)  # restored afterwards


def test_runs_a_recipe_given_by_absolute_or_relative_path_with_a_config_file(tune, shipped, tmp_path, monkeypatch):
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text((shipped / "recipes" / "echo_single_device.py").read_text())
    config = tmp_path / "my.yaml"
    config.write_text((shipped / "configs" / "toy" / "tiny_echo.yaml").read_text() + "extra: [1, 2]\n")
    assert tune("run", str(recipe), "--config", str(config), f"output_dir={tmp_path / 'a'}")[0] == 0
    assert _result(tmp_path / "a")["extra"] == [1, 2]
    monkeypatch.chdir(tmp_path)
    assert tune("run", "my_recipe.py", "--config=my.yaml", "output_dir=b", "~extra")[0] == 0
    assert _result(tmp_path / "b")["extra"] is None


def test_the_recipe_exit_status_is_returned(tune, shipped):
    assert tune("run", "dev/no_info", "--config", "toy/tiny_echo")[0] == 0
    recipe_fail = shipped / "recipes" / "echo_single_device.py"
    with pytest.warns(UserWarning, match="did you mean 'scaler.factor'"):
        code, _, err = tune("run", str(recipe_fail), "--config", "toy/tiny_echo", "scaler.factr=1")
    assert code == 1 and "scaler: the arguments do not match" in err  # the recipe's own one-line error


def test_recipe_help_is_the_recipes_own(tune, shipped):
    code, out, _ = tune("run", "echo_single_device", "--help")
    assert code == 0 and "--config CONFIG" in out and "Fixture recipe for the CLI tests" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["echo_singel_device", "--config", "x"],
            "unknown recipe 'echo_singel_device'; did you mean echo_single_device",
        ),
        (
            ["echo_single_device"],
            "needs --config CONFIG (a config name or a YAML file). Its configs: echo_default, toy/tiny_echo",
        ),
        (["echo_single_device", "--config", "toy/tiny"], "unknown config 'toy/tiny'; did you mean"),
        (["echo_single_device", "--config", "nope.yaml"], "config file not found: "),
        (["./nope.py", "--config", "x"], "recipe file not found: "),
        (["echo_single_device", "--nproc_per_node", "2", "--config", "x"], "torchrun flags go before the recipe"),
    ],
)
def test_user_mistakes_are_one_line_errors(tune, shipped, args, message):
    code, _, err = tune("run", *args)
    assert code == 1 and message in err and "Traceback" not in err


def test_torchrun_flags_are_refused_for_a_recipe_without_distributed_support(tune, shipped):
    code, _, err = tune("run", "--nproc_per_node", "2", "echo_single_device", "--config", "toy/tiny_echo")
    assert code == 1
    assert "recipe 'echo_single_device' does not support distributed runs" in err
    assert "torchrun flags (--nproc_per_node 2)" in err and "Recipes that do: dist_echo" in err


def test_torchrun_flags_launch_a_distributed_recipe_through_torch_distributed_run(tune_subprocess, tmp_path):
    # a real torchrun launch of two CPU processes: each writes the rank and world size torchrun gave it
    recipe, config = SHIPPED / "recipes" / "dist_echo.py", SHIPPED / "configs" / "toy" / "tiny_dist.yaml"
    out_dir = tmp_path / "dist"
    proc = tune_subprocess(
        "run", "--nproc_per_node", "2", "--standalone", str(recipe), "--config", str(config), f"output_dir={out_dir}"
    )
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert json.loads((out_dir / f"rank{rank}.json").read_text()) == {"world_size": 2, "tag": "two-processes"}


def test_a_recipe_file_without_recipe_info_may_be_launched_with_torchrun(tune_subprocess, tmp_path):
    # a user's own script (a torchtune recipe moved with `tune migrate`) declares nothing: torchrun flags launch it
    source = (SHIPPED / "recipes" / "dist_echo.py").read_text()
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(source.replace('RECIPE_INFO = {"supports_distributed": True, "configs": ["*/*_dist"]}\n', ""))
    assert "RECIPE_INFO" not in recipe.read_text()
    config, out_dir = SHIPPED / "configs" / "toy" / "tiny_dist.yaml", tmp_path / "dist"
    proc = tune_subprocess(
        "run", "--nproc_per_node", "2", "--standalone", str(recipe), "--config", str(config), f"output_dir={out_dir}"
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["rank0.json", "rank1.json"]


def test_a_failing_distributed_process_is_reported(tune_subprocess, tmp_path):
    recipe, config = SHIPPED / "recipes" / "dist_echo.py", SHIPPED / "configs" / "toy" / "tiny_dist.yaml"
    proc = tune_subprocess(
        "run", "--nproc_per_node", "1", str(recipe), "--config", str(config), "~tag", f"output_dir={tmp_path}"
    )
    assert proc.returncode == 1
    # one line for the first rank that failed; none of torchrun's failure report
    assert "tune: error: rank 0 failed" in proc.stderr, proc.stderr
    assert "traceback :" not in proc.stderr and "Root Cause" not in proc.stderr, proc.stderr


def test_config_flag_without_value(tune, shipped):
    code, _, err = tune("run", "echo_single_device", "--config")
    assert code == 1 and "--config needs a value" in err


def test_help_torchrun_lists_torchruns_own_flags(tune):
    code, out, _ = tune("run", "--help-torchrun")
    assert code == 0
    assert "usage: tune run [TORCHRUN FLAGS] RECIPE" in out
    for flag in ("--nnodes", "--rdzv-endpoint", "--standalone", "--master-port"):
        assert flag in out
