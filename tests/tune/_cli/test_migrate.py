"""`tune migrate PATH... [--output DIR] [--dry-run]` (tune/_cli/_migrate.py)."""

import re
import zipfile
from pathlib import Path

import pytest

from tests.recipes import test_torchtune_published_configs as published
from tests.recipes.test_torchtune_published_configs import torchtune_wheel  # noqa: F401 - the session fixture
from tune._cli._migrate import API_SECTION, MODULES_SECTION, read_api_table, table_path

# a torchtune user's script and config, written for these tests
SCRIPT = '''\
"""Fine-tunes with torchtune.models (this docstring stays as it is)."""
import torchtune
from torchtune.models.llama3_2 import llama3_2_1b  # the builder
from torchtune.config._utils import (
    _get_component_from_path,  # public in tune
    log_config,
)
from torchtune.modules.loss import ForwardKLLoss

MODEL = "torchtune.models.llama3_2.llama3_2_1b"
NOTE = 'see torchtune.models for builders'  # torchtune.x in a comment


def build():
    if torchtune.__version__: from torchtune import config, training
    return torchtune.models.llama3_2.lora_llama3_2_1b(lora_attn_modules=["q_proj"])
'''
SCRIPT_MIGRATED = '''\
"""Fine-tunes with torchtune.models (this docstring stays as it is)."""
import tune
from tune.models.llama3_2 import llama3_2_1b  # the builder
from tune.config import get_component_from_path as _get_component_from_path
from tune.config._utils import log_config  # public in tune
from tune.modules.loss import ForwardKLLoss

MODEL = "tune.models.llama3_2.llama3_2_1b"
NOTE = 'see torchtune.models for builders'  # torchtune.x in a comment


def build():
    if tune.__version__: from tune import config, training
    return tune.models.llama3_2.lora_llama3_2_1b(lora_attn_modules=["q_proj"])
'''
CONFIG = """\
# My torchtune config: `tune run lora_finetune_single_device --config my.yaml`
model:
  _component_: torchtune.models.llama3_2.lora_llama3_2_1b   # LoRA
  lora_attn_modules: ['q_proj', 'v_proj']
tokenizer:
  _component_: "torchtune.models.llama3.llama3_tokenizer"
  path: /tmp/torchtune/tokenizer.model
collate_fn: 'torchtune.data.padded_collate_sft'
loss: {_component_: torchtune.modules.loss.CEWithChunkedOutputLoss}
"""
CONFIG_MIGRATED = """\
# My torchtune config: `tune run lora_finetune_single_device --config my.yaml`
model:
  _component_: tune.models.llama3_2.lora_llama3_2_1b   # LoRA
  lora_attn_modules: ['q_proj', 'v_proj']
tokenizer:
  _component_: "tune.models.llama3.llama3_tokenizer"
  path: /tmp/torchtune/tokenizer.model
collate_fn: 'tune.data.padded_collate_sft'
loss: {_component_: tune.modules.loss.CEWithChunkedOutputLoss}
"""


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "configs").mkdir(parents=True)
    (root / "train.py").write_text(SCRIPT)
    (root / "configs" / "my.yaml").write_text(CONFIG)
    (root / "plain.py").write_text("import os\n")
    (root / "notes.txt").write_text("torchtune.models\n")  # not a .py or .yaml file: left alone
    return root


def test_migrates_a_tree_in_place_and_changes_nothing_else(tune, project):
    code, out, err = tune("migrate", str(project))
    assert code == 0, err
    assert (project / "train.py").read_text() == SCRIPT_MIGRATED
    assert (project / "configs" / "my.yaml").read_text() == CONFIG_MIGRATED
    assert (project / "plain.py").read_text() == "import os\n"
    assert (project / "notes.txt").read_text() == "torchtune.models\n"
    summary = out.splitlines()[0]
    assert summary == (
        "tune migrate: changed 2 of 3 files (config values: 4, imports: 5, names in code: 2, renamed: 1, strings: 1)"
    )


def test_a_second_run_changes_nothing(tune, project):
    tune("migrate", str(project))
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    code, out, _ = tune("migrate", str(project))
    assert code == 0 and out == "tune migrate: changed 0 of 3 files\n"
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before


def test_output_keeps_the_layout_and_the_sources(tune, project, tmp_path):
    out_dir = tmp_path / "migrated"
    code, _, err = tune("migrate", str(project), str(project / "train.py"), "--output", str(out_dir))
    assert code == 0, err
    assert (project / "train.py").read_text() == SCRIPT  # the sources are untouched
    assert (out_dir / "train.py").read_text() == SCRIPT_MIGRATED
    assert (out_dir / "configs" / "my.yaml").read_text() == CONFIG_MIGRATED
    assert (out_dir / "plain.py").read_text() == "import os\n"  # unchanged files are written too
    assert not (out_dir / "notes.txt").exists()


def test_dry_run_prints_a_diff_and_writes_nothing(tune, project):
    code, out, _ = tune("migrate", str(project / "configs" / "my.yaml"), "--dry-run")
    assert code == 0
    assert (project / "configs" / "my.yaml").read_text() == CONFIG
    path = project / "configs" / "my.yaml"
    assert f"--- {path}\n+++ {path}\n" in out
    assert "-  _component_: torchtune.models.llama3_2.lora_llama3_2_1b   # LoRA\n" in out
    assert "+  _component_: tune.models.llama3_2.lora_llama3_2_1b   # LoRA\n" in out
    assert out.splitlines()[-1] == "tune migrate: would change 1 of 1 file (config values: 4)"


def test_reports_names_of_the_migration_table_with_file_and_line(tune, project):
    rows = read_api_table(table_path().read_text(encoding="utf-8"))
    row = rows["torchtune.modules.loss.ForwardKLLoss"]
    code, out, _ = tune("migrate", str(project / "train.py"))
    assert code == 0
    assert (
        f"  {project / 'train.py'}:8: torchtune.modules.loss.ForwardKLLoss ({row.status}) — {row.why} — {row.todo}"
        " — see docs/migrating.md#public-api" in out
    )
    # a name `tune migrate` rewrites (_get_component_from_path) is not a place that needs a person; a module tune
    # lacks is
    assert "_get_component_from_path" not in out
    assert "tune has no module tune.config._utils" in out


def test_keeps_line_endings_and_encoding(tune, tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes("# café\r\nimport torchtune.data\r\nx = 'torchtune.data.Message'\r\n".encode())
    assert tune("migrate", str(path))[0] == 0
    assert path.read_bytes() == "# café\r\nimport tune.data\r\nx = 'tune.data.Message'\r\n".encode()


def test_errors_are_one_line_each_and_the_other_files_are_migrated(tune, project):
    (project / "broken.yaml").write_text("model:\n  _component_: [torchtune.x\n")
    (project / "broken.py").write_text("import torchtune\ndef f(:\n")
    (project / "latin1.py").write_bytes(b"x = '\xe9'\n")
    missing = project / "missing.yaml"
    code, out, err = tune("migrate", str(project), str(missing), str(project / "notes.txt"))
    assert code == 1
    assert "Traceback" not in err
    lines = err.splitlines()
    assert f"tune: error: {missing}: no such file or directory" in lines
    assert f"tune: error: {project / 'notes.txt'}: not a .py, .yaml, .yml file" in lines
    assert any(line.startswith(f"tune: error: {project / 'broken.yaml'}: line 3: YAML that does not") for line in lines)
    assert any(line.startswith(f"tune: error: {project / 'broken.py'}: line 2: Python that does not") for line in lines)
    assert f"tune: error: {project / 'latin1.py'}: not utf-8 text (byte 5)" in lines
    assert len([line for line in lines if line.startswith("tune: error:")]) == 5
    assert (project / "train.py").read_text() == SCRIPT_MIGRATED
    assert (project / "broken.py").read_text() == "import torchtune\ndef f(:\n"
    assert "; 5 could not be migrated" in out.splitlines()[0]


def test_torchtune_modules_tokenizers_becomes_the_path_tune_has(tune, tmp_path):
    # torchtune before 0.5 kept its tokenizer classes in torchtune.modules.tokenizers; tune has them (as torchtune
    # 0.6 has) under modules.transforms.tokenizers. Before: rewritten to tune.modules.tokenizers, which tune lacks.
    script = tmp_path / "tok.py"
    script.write_text(
        "from torchtune.modules.tokenizers import SentencePieceBaseTokenizer\n"
        "import torchtune.modules.tokenizers as toks\n"
        "base = torchtune.modules.tokenizers.TikTokenBaseTokenizer\n"
    )
    config = tmp_path / "tok.yaml"
    config.write_text("tokenizer:\n  _component_: torchtune.modules.tokenizers.SentencePieceBaseTokenizer\n")
    code, out, err = tune("migrate", str(script), str(config))
    assert code == 0, err
    assert script.read_text() == (
        "from tune.modules.transforms.tokenizers import SentencePieceBaseTokenizer\n"
        "import tune.modules.transforms.tokenizers as toks\n"
        "base = tune.modules.transforms.tokenizers.TikTokenBaseTokenizer\n"
    )
    assert config.read_text() == (
        "tokenizer:\n  _component_: tune.modules.transforms.tokenizers.SentencePieceBaseTokenizer\n"
    )
    assert "need" not in out  # every name has a place in tune: nothing for a person to do
    from tune.config import get_component_from_path

    assert get_component_from_path("tune.modules.transforms.tokenizers.SentencePieceBaseTokenizer").__name__ == (
        "SentencePieceBaseTokenizer"
    )


def test_run_output_folders_are_neither_scanned_nor_rewritten(tune, project):
    # Before: every .yaml/.py below the PATH was read, a run's saved config rewritten, and a broken file in an
    # output folder made the whole command fail.
    saved = "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
    runs = {
        "output": "output/lora/torchtune_config.yaml",  # torchtune's output_dir, by name
        "outputs": "outputs/run1/config.yaml",
        "runs/step_4": "runs/step_4/config.yaml",  # a tune checkpoint: has a .complete marker
        "hf_export": "hf_export/config.yaml",  # safetensors shards
        "tt_run": "tt_run/torchtune_config.yaml",  # torchtune's saved config
    }
    for relative in runs.values():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(saved)
    (project / "output" / "broken.yaml").write_text("model: [torchtune.x\n")  # would be an error if read
    (project / "runs" / "step_4" / ".complete").write_text("{}")
    (project / "hf_export" / "model-00001-of-00002.safetensors").write_bytes(b"")
    nested = project / "runs" / "step_4" / "inner"
    nested.mkdir()
    (nested / "x.yaml").write_text(saved)  # below a skipped folder: not reached either

    code, out, err = tune("migrate", str(project))
    assert code == 0, err
    for relative in [*runs.values(), "runs/step_4/inner/x.yaml"]:
        assert (project / relative).read_text() == saved, relative
    assert (project / "configs" / "my.yaml").read_text() == CONFIG_MIGRATED  # the project itself is migrated
    assert out.splitlines()[0].startswith("tune migrate: changed 2 of 3 files")
    assert err.splitlines() == [
        f"tune migrate: skipped {project / 'hf_export'}: holds model-00001-of-00002.safetensors, written by a run; "
        "name it as a PATH to migrate it anyway",
        f"tune migrate: skipped {project / 'output'}: a run's output folder (output/); name it as a PATH to migrate "
        "it anyway",
        f"tune migrate: skipped {project / 'outputs'}: a run's output folder (outputs/); name it as a PATH to "
        "migrate it anyway",
        f"tune migrate: skipped {project / 'runs' / 'step_4'}: holds .complete, written by a run; name it as a "
        "PATH to migrate it anyway",
        f"tune migrate: skipped {project / 'tt_run'}: holds torchtune_config.yaml, written by a run; name it as a "
        "PATH to migrate it anyway",
    ]
    # named as a PATH, an output folder is migrated
    code, _, err = tune("migrate", str(project / "outputs"))
    assert code == 0, err
    assert "tune.models" in (project / "outputs" / "run1" / "config.yaml").read_text()


def _headings(text: str) -> set[str]:
    # GitHub's anchors: lower case, punctuation other than '-' dropped, spaces to '-'
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }


def test_every_line_that_needs_a_person_points_to_a_section_that_exists(tune, tmp_path):
    doc = table_path().read_text(encoding="utf-8")
    rows = read_api_table(doc, (API_SECTION, MODULES_SECTION))
    assert {row.section for row in rows.values()} == {API_SECTION, MODULES_SECTION}
    # every name of both tables, and a module tune does not have
    script = tmp_path / "uses_everything.py"
    script.write_text("".join(f"x = '{name}'\n" for name in rows) + "import torchtune.no_such_module\n")
    code, out, err = tune("migrate", str(script), "--dry-run")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith(f"  {script}:")]
    assert len(lines) == len(rows) + 1
    anchors = set()
    for line in lines:
        found = re.search(r" — see docs/migrating\.md#([\w-]+)$", line)
        assert found, f"no section named: {line}"
        anchors.add(found.group(1))
    # Before: no line named a section; the Module paths table was not read
    assert anchors == {"public-api", "module-paths"}
    assert anchors <= _headings(doc)


def test_help_names_the_options(tune):
    code, out, _ = tune("migrate", "--help")
    assert code == 0 and "--output DIR" in out and "--dry-run" in out


# ---------------------------------------------------------------------------------------------------------------
# torchtune 0.6.1's own configs, from its published wheel
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_torchtune_published_configs_migrate_and_validate(tune, tmp_path, torchtune_wheel):  # noqa: F811
    """`tune migrate` on the wheel's whole recipes/configs tree, then every fine-tuning config of a family tune
    ships (the selection of tests/recipes/test_torchtune_published_configs.py) validates against its recipe."""
    from tune.config import find_recipe, validate_config

    source = tmp_path / "torchtune"
    with zipfile.ZipFile(torchtune_wheel) as archive:
        archive.extractall(source, [n for n in archive.namelist() if n.startswith("recipes/configs/")])
        recipe_of = published._recipe_of_configs(archive.read("torchtune/_recipe_registry.py").decode())
    out_dir = tmp_path / "migrated"
    code, out, err = tune("migrate", str(source / "recipes" / "configs"), "--output", str(out_dir))
    assert code == 0, err
    migrated = sorted(out_dir.rglob("*.yaml"))
    assert len(migrated) == len(list((source / "recipes" / "configs").rglob("*.yaml")))
    leftover = [p for p in migrated if "_component_: torchtune." in p.read_text()]
    assert not leftover, leftover

    overrides = published._path_overrides(tmp_path)
    failed, checked = {}, 0
    for name, recipe in sorted(recipe_of.items()):
        if name.split("/")[0] not in published._FAMILIES or recipe not in published._SFT_RECIPES:
            continue
        path = out_dir / f"{name}.yaml"
        checked += 1
        problems = [str(p) for p in validate_config(path, find_recipe(recipe).path, overrides)]
        if published._missing_optional(path) is not None:
            assert len(problems) == 1 and "pip install 'tune[bitsandbytes]'" in problems[0], (name, problems)
        elif problems:
            failed[name] = problems
    print(f"\n{out.splitlines()[0]}\nvalidated {checked - len(failed)}/{checked} migrated fine-tuning configs")
    assert 110 <= checked <= 125
    assert not failed, "\n".join(f"{name}: {' | '.join(problems)}" for name, problems in failed.items())
