"""torchtune 0.6.1's own recipes, moved with ``tune migrate``, run under tune and train exactly as tune's do.

Each recipe and its Llama 3.2 config are taken at test time from torchtune's published 0.6.1 wheel (downloaded once
into ``~/.cache/tune-tests`` by tests/recipes/test_torchtune_published_configs.py's fixture; nothing of it is kept
in this repository), passed through ``tune migrate``, and run with ``tune run <migrated file> --config <migrated
config>``. tune's recipe of the same name then runs the same migrated config. Both get the same overrides (the
tiny Llama 3.2 checkpoint, tokenizer and Alpaca file of tests/recipes/_family_assets.py, two steps, ``seed=0``), so
they must log the same loss at every step: within 1e-5 (fp32 on CPU). The distributed recipes run on 2 gloo ranks
(slow tier). torchtune's generate.py, migrated the same way, continues a prompt as tune's generate recipe does.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.recipes import _family_assets as assets
from tests.recipes import _torchtune_generate as _generate
from tests.recipes import test_torchtune_published_configs as published
from tests.recipes.test_torchtune_published_configs import run_assets, torchtune_wheel  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

_FAMILY = "llama3_2"
_SINGLE_DEVICE = [
    ("full_finetune_single_device", "llama3_2/1B_full_single_device"),
    ("lora_finetune_single_device", "llama3_2/1B_lora_single_device"),
]
# torchtune's lora_finetune_distributed.py calls init_process_group("cuda:nccl,cpu:gloo") itself, which a CPU-only
# PyTorch cannot create (torchtune's recipe cannot run there either): it runs on a machine with CUDA (gpu marker)
_DISTRIBUTED = [
    pytest.param("full_finetune_distributed", "llama3_2/1B_full", id="full_finetune_distributed"),
    pytest.param(
        "lora_finetune_distributed", "llama3_2/1B_lora", id="lora_finetune_distributed", marks=pytest.mark.gpu
    ),
]


def _tune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tune._cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def _losses(out: Path) -> dict[int, float]:
    """Step -> loss from every JSONL metric log under ``out``."""
    losses = {}
    for log in sorted(out.rglob("*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if "loss" in record:
                losses[record["step"]] = record["loss"]
    return losses


def _migrated(wheel: Path, recipe: str, config: str, root: Path) -> tuple[Path, Path]:
    """torchtune's recipe file and config from the wheel, through ``tune migrate``: (recipe, config) paths."""
    source = root / "torchtune"
    source.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        (source / f"{recipe}.py").write_bytes(archive.read(f"recipes/{recipe}.py"))
        (source / "config.yaml").write_bytes(archive.read(f"recipes/configs/{config}.yaml"))
    proc = _tune("migrate", str(source), "--output", str(root / "migrated"), cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    migrated = root / "migrated" / f"{recipe}.py"
    assert "torchtune" not in "".join(
        line for line in migrated.read_text().splitlines(keepends=True) if line.lstrip().startswith(("import", "from"))
    )
    return migrated, root / "migrated" / "config.yaml"


# the configs warm up for 100 steps (lr 0 at step 1): without warm-up step 2 follows a real update
_NO_WARMUP = "lr_scheduler.num_warmup_steps=0"


def _dpo_overrides(data: Path) -> list[str]:
    """The generated preference pairs of the family's tiny assets in place of the config's hub dataset."""
    return [
        _NO_WARMUP,
        "dataset._component_=tune.datasets.preference_dataset",
        "dataset.source=json",
        f"dataset.data_files={data / 'pairs.json'}",
        "dataset.split=train",
    ]


def _kd_overrides(data: Path) -> list[str]:
    """The teacher: the family's full builder at the tiny dimensions, reading the student's tiny checkpoint."""
    return [*assets.teacher_overrides(_FAMILY, data / "hf", "LLAMA3_2"), _NO_WARMUP]


# torchtune 0.6.1's KD loop backpropagates each micro-batch's *mean* loss and then divides the gradients by the
# step's token count again (its SFT loops multiply the mean by the token count first), so its gradients are about
# a micro-batch's token count too small, and micro-batches rather than tokens weigh alike. The migrated recipe keeps
# that loop; AdamW's update is nearly scale-free, so only its eps term tells the runs apart after step 1 (step 2:
# 5.8e-5 here). Step 1, before any update, agrees exactly.
_KD_STEP_2_TOLERANCE = 1e-3

# post-training recipes: (recipe, torchtune config, overrides beyond the SFT ones (dataset.* ones replace them),
# tolerance of step 2)
_POST_TRAINING = [
    ("lora_dpo_single_device", "llama3_1/8B_lora_dpo_single_device", _dpo_overrides, 1e-5),
    pytest.param(  # the suite's time budget: KD's copy in the slow tier, DPO's in the default one
        "knowledge_distillation_single_device",
        "llama3_2/8B_to_1B_KD_lora_single_device",
        _kd_overrides,
        _KD_STEP_2_TOLERANCE,
        marks=pytest.mark.slow,
    ),
]
_POST_TRAINING_IDS = ["lora_dpo_single_device", "knowledge_distillation_single_device"]


def _run(
    recipe: str, config: Path, data: Path, out: Path, distributed: bool, cwd: Path, extra=None
) -> dict[int, float]:
    cfg = yaml.safe_load(config.read_text())
    overrides = [*published._run_overrides(_FAMILY, cfg, data, out), "seed=0"]
    if extra is not None:
        added = extra(data)
        if any(o.startswith("dataset.") for o in added):
            overrides = [o for o in overrides if not o.startswith("dataset.")]
        overrides += added
    torchrun = ["--nproc_per_node", "2", "--standalone"] if distributed else []
    proc = _tune("run", *torchrun, recipe, "--config", str(config), *overrides, cwd=cwd)
    assert proc.returncode == 0, f"{recipe}:\n{proc.stderr[-4000:]}"
    return _losses(out)


def _compare(
    wheel: Path,
    run_assets,  # noqa: F811
    tmp_path: Path,
    recipe: str,
    config: str,
    distributed: bool,
    extra=None,
    step_2_abs=1e-5,
) -> None:
    data = run_assets(_FAMILY)
    migrated, migrated_config = _migrated(wheel, recipe, config, tmp_path)
    theirs = _run(str(migrated), migrated_config, data, tmp_path / "torchtune_run", distributed, tmp_path, extra)
    ours = _run(recipe, migrated_config, data, tmp_path / "tune_run", distributed, tmp_path, extra)
    print(f"{recipe}: torchtune's recipe migrated {theirs}\n{recipe}: tune's recipe           {ours}")
    assert sorted(theirs) == sorted(ours) == [1, 2]
    assert theirs[1] == pytest.approx(ours[1], abs=1e-5, rel=0)
    assert theirs[2] == pytest.approx(ours[2], abs=step_2_abs, rel=0)
    # the migrated recipe saved its model where torchtune's recipes do (output_dir/epoch_0)
    saved = sorted(p.name for p in (tmp_path / "torchtune_run" / "epoch_0").iterdir())
    assert any(name.endswith(".safetensors") for name in saved), saved


@pytest.mark.parametrize("recipe,config", _SINGLE_DEVICE, ids=[r for r, _ in _SINGLE_DEVICE])
def test_migrated_single_device_recipe_trains_as_tunes_own(torchtune_wheel, run_assets, tmp_path, recipe, config):  # noqa: F811
    _compare(torchtune_wheel, run_assets, tmp_path, recipe, config, distributed=False)


@pytest.mark.slow
@pytest.mark.parametrize("recipe,config", _DISTRIBUTED)
def test_migrated_distributed_recipe_trains_as_tunes_own(torchtune_wheel, run_assets, tmp_path, recipe, config):  # noqa: F811
    _compare(torchtune_wheel, run_assets, tmp_path, recipe, config, distributed=True)


@pytest.mark.parametrize("recipe,config,extra,step_2_abs", _POST_TRAINING, ids=_POST_TRAINING_IDS)
def test_migrated_post_training_recipe_trains_as_tunes_own(
    torchtune_wheel,  # noqa: F811
    run_assets,  # noqa: F811
    tmp_path,
    recipe,
    config,
    extra,
    step_2_abs,
):
    _compare(torchtune_wheel, run_assets, tmp_path, recipe, config, False, extra=extra, step_2_abs=step_2_abs)


def test_migrated_generate_recipe_continues_the_prompt_as_tunes_own(torchtune_wheel, run_assets, tmp_path):  # noqa: F811
    # torchtune's generate.py and generation.yaml, migrated, greedy on the tiny Llama 2 checkpoint: the text it
    # logs (prompt and continuation, decoded together) is the prompt followed by what tune's generate prints
    migrated, ours = _generate.run_both(torchtune_wheel, tmp_path, run_assets(_generate.FAMILY))
    assert migrated.returncode == 0, migrated.stderr[-4000:]
    assert ours.returncode == 0, ours.stderr[-4000:]
    logged, printed = _generate.generated_texts(migrated, ours)
    print(f"torchtune's generate.py, migrated: {logged!r}\ntune's generate recipe:            {printed!r}")
    assert printed and logged == _generate.PROMPT + printed
