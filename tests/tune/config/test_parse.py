"""tune/config/_parse.py: `@config.parse` turns recipe_main(cfg) into a script entry point."""

import json
import subprocess
import sys

import pytest

from tune.config import ConfigError, parse

received = []


@parse
def recipe_main(cfg):
    received.append(cfg)
    if cfg.get("progress_bar"):  # as a recipe's training loop: the bar is open when the error comes
        from tqdm import tqdm

        bar = tqdm(total=3, disable=False)
        bar.update(1)
    if cfg.get("fail"):
        raise ConfigError("model.x: a config problem raised inside the recipe")
    return "done"


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb:\n  c: 2\nout: ${b.c}\n")
    received.clear()
    return path


def test_reads_the_config_and_applies_overrides_in_any_order(config_file):
    assert recipe_main(["a=5", "--config", str(config_file), "b.c=x=y"]) == "done"
    (cfg,) = received
    assert (cfg.a, cfg.b.c, cfg.out) == (5, "x=y", "x=y")


def test_argv_defaults_to_sys_argv(config_file, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["my_recipe.py", f"--config={config_file}", "~a"])
    recipe_main()
    assert "a" not in received[0]


def test_a_shipped_config_name_is_accepted(shipped):
    recipe_main(["--config", "toy/tiny_echo"])
    assert received[-1].message == "hello"


def test_user_errors_print_one_line_and_exit_1(config_file, capsys, monkeypatch):
    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["my_recipe.py"])
    with pytest.raises(SystemExit) as info:
        recipe_main(["--config", str(config_file), "fail=true"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err == "my_recipe.py: error: model.x: a config problem raised inside the recipe\n"
    with pytest.raises(SystemExit):
        recipe_main(["--config", str(config_file.parent / "missing.yaml")])
    assert f"config file not found: {config_file.parent}/missing.yaml" in capsys.readouterr().err


def test_an_error_during_a_progress_bar_is_a_line_of_its_own(config_file, capsys, monkeypatch):
    monkeypatch.delenv("TUNE_DEBUG", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(sys, "argv", ["my_recipe.py"])
    with pytest.raises(SystemExit):
        recipe_main(["--config", str(config_file), "fail=true", "progress_bar=true"])
    err = capsys.readouterr().err
    assert "1/3" in err  # the bar was drawn
    assert "\nmy_recipe.py: error: model.x: a config problem raised inside the recipe\n" in err, repr(err)


def test_tune_debug_raises_with_the_traceback(config_file, monkeypatch):
    monkeypatch.setenv("TUNE_DEBUG", "1")
    with pytest.raises(ConfigError, match="raised inside the recipe"):
        recipe_main(["--config", str(config_file), "fail=true"])


def test_missing_config_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        recipe_main(["a=1"])
    assert info.value.code == 2 and "--config" in capsys.readouterr().err


def test_a_recipe_runs_as_a_plain_python_script(shipped, tmp_path):
    # `python recipe.py --config ...`: the recipe's own components (Scaler) resolve from __main__
    recipe = shipped / "recipes" / "echo_single_device.py"
    out = tmp_path / "out"
    cmd = [sys.executable, str(recipe), "--config", str(shipped / "configs/toy/tiny_echo.yaml"), f"output_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["scaled"] == [2.0, 4.0]  # values [1, 2] passed by the recipe, factor 2 from the config
    assert result["things"] == ["Fraction(1, 4)", "datetime.timedelta(days=2)"]


def _env():
    import os
    from pathlib import Path

    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
