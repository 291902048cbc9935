"""A real wheel: recipes and configs ship inside the package, and an installed `tune` finds them.

The wheel is built from a staged copy of the project (pyproject.toml, README.md, tune/, recipes/, configs/) with
one fixture recipe and its configs added, so the checks mean something whatever the repository ships today.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "assets" / "cli" / "shipped"


def _files(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    stage = tmp_path_factory.mktemp("stage")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, stage / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "tune", stage / "tune", ignore=ignore)
    for folder in ("recipes", "configs"):
        if (REPO / folder).is_dir():
            shutil.copytree(REPO / folder, stage / folder, ignore=ignore)
        shutil.copytree(FIXTURE / folder, stage / folder, dirs_exist_ok=True)
    (stage / "docs").mkdir()
    shutil.copy(REPO / "docs" / "migrating.md", stage / "docs" / "migrating.md")  # read by `tune migrate`
    return stage


@pytest.fixture(scope="module")
def wheel(staged, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(out),
        str(staged),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("tune-*.whl")
    return path


def test_wheel_ships_recipes_and_configs_inside_the_package(staged, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top_level = {n.split("/")[0] for n in names}
    assert "recipes" not in top_level and "configs" not in top_level
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"tune"}
    for folder in ("recipes", "configs"):
        expected = {f"tune/_shipped/{folder}/{rel}" for rel in _files(staged / folder)}
        shipped = {n for n in names if n.startswith(f"tune/_shipped/{folder}/")}
        print(f"{folder}: {len(expected)} files staged, {len(shipped)} in the wheel")
        assert shipped == expected
    assert {f"tune/{rel}" for rel in _files(staged / "tune") if rel.endswith(".py")} <= names
    assert "tune/_shipped/migrating.md" in names  # the migration table `tune migrate` reports from
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tune = tune._cli.main:main" in text


def test_installed_wheel_finds_and_runs_its_shipped_recipes(staged, wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # the dependencies (torch, omegaconf, ...) come from the test environment, after the venv's own packages
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUNE_DEBUG")}
    work = tmp_path / "elsewhere"  # not the checkout: nothing may come from the working tree
    work.mkdir()

    def tune(*args: str) -> str:
        proc = subprocess.run(
            [venv / "bin" / "tune", *args], capture_output=True, text=True, timeout=120, cwd=work, env=env
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    where = subprocess.check_output([python, "-c", "import tune; print(tune.__file__)"], text=True, cwd=work, env=env)
    assert Path(where.strip()).is_relative_to(venv)
    listing = tune("ls")
    for recipe in _files(staged / "recipes"):
        if not any(part.startswith("_") for part in Path(recipe).parts):
            assert recipe.removesuffix(".py") in listing
    for config in _files(staged / "configs"):
        assert config.removesuffix(".yaml") in listing
    assert tune("cat", "toy/tiny_echo") == (FIXTURE / "configs" / "toy" / "tiny_echo.yaml").read_text()
    tune("run", "echo_single_device", "--config", "toy/tiny_echo", f"output_dir={tmp_path / 'out'}")
    assert (tmp_path / "out" / "result.json").is_file()
