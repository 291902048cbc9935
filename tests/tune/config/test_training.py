"""tune/config/_training.py: the optional keys of the training recipes and their defaults, the checks of the
training settings, and the LR scheduler, tensor-parallel plan and collator built from the config.

Also the places that use them: ``config.parse`` fills the optional keys a recipe names in its RECIPE_INFO
(tune/config/_parse.py), discovery rejects unknown table names (tune/config/_discovery.py), and
``validate_config`` fills the defaults and runs the training checks (tune/config/_validate.py).
"""

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf
from torch import nn

from tests._helpers import ListDataset
from tune.config import ConfigError, ConfigProblem, RecipeError, read_recipe_info, validate_config
from tune.config._training import (
    OPTIONAL_KEYS,
    KeepDefault,
    apply_defaults,
    check_finetuning_schedule,
    check_model_converters,
    check_training_config,
    errors_at,
    instantiate_collate,
    instantiate_lr_scheduler,
    instantiate_tensor_parallel_plan,
    optional_key_tables,
    recipe_defaults,
    table_problems,
    training_config_problems,
)
from tune.data import PackedDataset

REPO = Path(__file__).resolve().parents[3]
FULL_RECIPE = REPO / "recipes" / "full_finetune_single_device.py"
FULL_DISTRIBUTED_RECIPE = REPO / "recipes" / "full_finetune_distributed.py"
FULL_TINY = REPO / "tests" / "recipes" / "assets" / "full_tiny.yaml"
# the optional keys full_tiny.yaml sets, but for lr_scheduler (OPTIONAL_KEYS["finetune"] has defaults for all)
FULL_TINY_OPTIONAL = [
    "log_every_n_steps", "log_peak_memory_stats", "clip_grad_norm", "compile", "optimizer_in_bwd", "collate_fn",
    "enable_activation_checkpointing", "enable_activation_offloading", "profiler",
]  # fmt: skip
FULL_TINY_PATHS = ["assets_dir=/nonexistent/assets", "output_dir=/nonexistent/out"]  # validate reads no file

# Components importable by dotted path, written to a temporary directory on sys.path (see `components`).
COMPONENTS_MODULE = "training_config_test_components"
COMPONENTS = '''
class PeftAdapters:
    """A converter of kind "peft": QAT declares must_follow = ("peft",)."""

    kind = "peft"

    def convert(self, model):
        return model

    def post_optimizer_hook(self, model):
        pass


class FixedLengthCollator:
    def __init__(self, length):
        self.length = length

    def __call__(self, batch):
        return {"num_samples": len(batch), "length": self.length}


def plan_for_model(model, style="colwise"):
    return {"model": model, "style": style}


def plan_without_model(style="rowwise"):
    return {"style": style}
'''


@pytest.fixture
def components(tmp_path, monkeypatch):
    (tmp_path / f"{COMPONENTS_MODULE}.py").write_text(COMPONENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield COMPONENTS_MODULE
    sys.modules.pop(COMPONENTS_MODULE, None)


def _training_cfg(**values):
    """A training config with every optional key of the "finetune" table filled in, as recipes see it."""
    cfg = OmegaConf.create({"gradient_accumulation_steps": 1, **values})
    apply_defaults(cfg, ["finetune"])
    return cfg


def _problems(cfg, distributed=False) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        check_training_config(cfg, distributed=distributed)
    return info.value.problems


# ------------------------------------------------------------------------------------- tables and defaults


def test_recipe_defaults_merge_the_named_tables_in_order():
    defaults = recipe_defaults(["finetune", "lora"])
    assert defaults == {**OPTIONAL_KEYS["finetune"], **OPTIONAL_KEYS["lora"]}
    assert defaults["save_adapter_weights_only"] is False and defaults["log_every_n_steps"] == 1
    assert recipe_defaults([]) == {}


def test_recipe_defaults_reject_an_unknown_table_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown table of optional keys 'finetuen'; known: finetune, lora, distrib"):
        recipe_defaults(["finetune", "finetuen"])


def test_optional_key_tables_of_a_recipe_info():
    assert optional_key_tables({"configs": [], "optional_keys": ["finetune", "lora"]}) == ["finetune", "lora"]
    assert optional_key_tables({"configs": []}) == []
    assert optional_key_tables(None) == []  # a recipe without RECIPE_INFO


def test_apply_defaults_fills_only_missing_keys_and_returns_them():
    cfg = OmegaConf.create({"clip_grad_norm": 1.5, "log_every_n_steps": 10, "save_adapter_weights_only": True})
    given = set(cfg)
    filled = apply_defaults(cfg, ["finetune", "lora"])
    assert filled == [k for k in recipe_defaults(["finetune", "lora"]) if k not in given]
    assert "clip_grad_norm" not in filled and "log_every_n_steps" not in filled
    assert (cfg.clip_grad_norm, cfg.log_every_n_steps, cfg.save_adapter_weights_only) == (1.5, 10, True)
    assert cfg.collate_fn is None and cfg.compile is False and cfg.profiler is None  # collate_fn: by device
    assert apply_defaults(cfg, ["finetune", "lora"]) == []  # nothing left to fill


def test_apply_defaults_keeps_an_explicit_null():
    # keep_last_n_checkpoints: null and log_every_n_steps: null are explicit choices, not missing keys
    cfg = OmegaConf.create({"keep_last_n_checkpoints": None, "log_every_n_steps": None})
    filled = apply_defaults(cfg, ["finetune"])
    assert "keep_last_n_checkpoints" not in filled and "log_every_n_steps" not in filled
    assert cfg.log_every_n_steps is None  # the default, 1, would hide the config's mistake from the checks


def test_apply_defaults_keeps_a_mandatory_missing_value():
    # `???` says "this run must set it" (OmegaConf's mandatory value); validate_config reports it when unset
    cfg = OmegaConf.create({"clip_grad_norm": "???"})
    filled = apply_defaults(cfg, ["finetune"])
    assert "clip_grad_norm" not in filled
    assert OmegaConf.is_missing(cfg, "clip_grad_norm")


def test_apply_defaults_works_on_a_struct_config():
    cfg = OmegaConf.create({"compile": True})
    OmegaConf.set_struct(cfg, True)  # as loaded configs may be: new keys are refused outside open_dict
    apply_defaults(cfg, ["lora"])
    assert cfg.save_adapter_weights_only is False and cfg.compile is True


def test_apply_defaults_rejects_an_unknown_table():
    cfg = OmegaConf.create({})
    with pytest.raises(ValueError, match="unknown table of optional keys 'nope'"):
        apply_defaults(cfg, ["nope"])


# ------------------------------------------------------------------------- config.parse fills the defaults

RECIPE_WITH_TABLES = """
import json
import sys

from omegaconf import OmegaConf

from tune import config

RECIPE_INFO = {"supports_distributed": False, "configs": [], "optional_keys": ["finetune", "lora"]}


@config.parse
def recipe_main(cfg):
    cfg.epochs, cfg.get("my_new_key")  # the keys this recipe reads besides its tables: a copy may add its own
    print(json.dumps(OmegaConf.to_container(cfg)))


if __name__ == "__main__":
    sys.exit(recipe_main())
"""

RECIPE_WITHOUT_INFO = """
from tune import config

received = []


@config.parse
def recipe_main(cfg):
    received.append(cfg)
"""


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def small_config(tmp_path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text("epochs: 1\nclip_grad_norm: 2.0\nlr_scheduler: null\n")
    return path


def test_parse_fills_the_tables_of_the_recipe_info_when_run_as_a_script(tmp_path, small_config):
    script = tmp_path / "my_recipe.py"
    script.write_text(RECIPE_WITH_TABLES)
    env = {k: v for k, v in os.environ.items() if k != "TUNE_DEBUG"}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, str(script), "--config", str(small_config), "log_every_n_steps=5"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    cfg = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(cfg) == {"epochs", *recipe_defaults(["finetune", "lora"])}
    # the config's values and the command line's win over the defaults, an explicit null included
    assert (cfg["clip_grad_norm"], cfg["lr_scheduler"], cfg["log_every_n_steps"]) == (2.0, None, 5)
    assert cfg["save_adapter_weights_only"] is False and cfg["collate_fn"] is None


def _run_script(tmp_path, config_path, *overrides):
    script = tmp_path / "my_recipe.py"
    script.write_text(RECIPE_WITH_TABLES)
    env = {k: v for k, v in os.environ.items() if k != "TUNE_DEBUG"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(script), "--config", str(config_path), *overrides],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip


def test_parse_rejects_a_key_the_recipe_never_reads_naming_the_closest(tmp_path, small_config):
    run = _run_script(tmp_path, small_config, "epoch=2", "clip_grad_nrom=1.0")
    assert run.returncode == 1
    assert "epoch: unknown key: the recipe does not read it. did you mean 'epochs'?" in run.stderr
    assert "clip_grad_nrom: unknown key: the recipe does not read it. did you mean 'clip_grad_norm'?" in run.stderr
    assert "Traceback" not in run.stderr


def test_parse_accepts_the_keys_a_copied_recipe_reads_and_config_variables(tmp_path):
    # my_new_key is read by this (copied) recipe; assets_dir is a variable other values refer to
    path = tmp_path / "cfg.yaml"
    path.write_text("epochs: 1\nmy_new_key: ${assets_dir}/x\nassets_dir: /data\n")
    run = _run_script(tmp_path, path, "assets_dir=/elsewhere")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["my_new_key"] == "${assets_dir}/x"


def test_validate_reports_unknown_keys_of_a_recipe_with_tables():
    problems = validate_config(FULL_TINY, FULL_RECIPE, [*FULL_TINY_PATHS, "batch_sizee=4", "low_cpu_ram=True"])
    assert [(p.key, p.message) for p in problems] == [
        (
            "batch_sizee",
            "unknown key: the recipe does not read it. did you mean 'batch_size'? Remove it, or fix its name",
        )
    ]  # low_cpu_ram is one of torchtune's keys that tune ignores (with a warning at run time)


def test_parse_fills_nothing_for_a_recipe_without_recipe_info(tmp_path, small_config):
    path = tmp_path / "no_info_recipe.py"
    path.write_text(RECIPE_WITHOUT_INFO)
    module = _load_module(path, "no_info_recipe")
    module.recipe_main(["--config", str(small_config)])
    (cfg,) = module.received
    assert set(cfg) == {"epochs", "clip_grad_norm", "lr_scheduler"}


def test_parse_fills_nothing_for_a_recipe_info_without_optional_keys(tmp_path, small_config):
    path = tmp_path / "plain_info_recipe.py"
    path.write_text('RECIPE_INFO = {"supports_distributed": False}\n' + RECIPE_WITHOUT_INFO)
    module = _load_module(path, "plain_info_recipe")
    module.recipe_main(["--config", str(small_config)])
    assert set(module.received[0]) == {"epochs", "clip_grad_norm", "lr_scheduler"}


def test_discovery_rejects_an_unknown_table_in_recipe_info(tmp_path):
    path = tmp_path / "bad_tables.py"
    path.write_text('RECIPE_INFO = {"configs": [], "optional_keys": ["finetune", "qlora"]}\n')
    with pytest.raises(RecipeError, match=r"\['optional_keys'\] names unknown tables \['qlora'\]; known: finetune"):
        read_recipe_info(path)
    path.write_text('RECIPE_INFO = {"configs": [], "optional_keys": "finetune"}\n')
    with pytest.raises(RecipeError, match=r"\['optional_keys'\] must be a list"):
        read_recipe_info(path)
    path.write_text('RECIPE_INFO = {"configs": [], "optional_keys": ["finetune", "distributed"]}\n')
    assert read_recipe_info(path)["optional_keys"] == ["finetune", "distributed"]


# --------------------------------------------------------------------------------------------- errors_at


def test_errors_at_reports_a_value_error_at_the_key():
    with pytest.raises(ConfigError) as info:
        with errors_at("batch_size", 64):
            raise ValueError("the dataset gives 3 full batches")
    (problem,) = info.value.problems
    assert (problem.key, problem.message, problem.value) == ("batch_size", "the dataset gives 3 full batches", 64)
    assert str(info.value) == "batch_size = 64: the dataset gives 3 full batches"


def test_errors_at_passes_config_errors_and_other_exceptions_through():
    original = ConfigError(ConfigProblem("model.x", "inner"))
    with pytest.raises(ConfigError) as info:
        with errors_at("outer"):
            raise original
    assert info.value is original
    with pytest.raises(TypeError, match="not a config mistake"):
        with errors_at("outer"):
            raise TypeError("not a config mistake")


# ---------------------------------------------------------------------------------- check_training_config


def test_a_config_with_defaults_filled_passes():
    check_training_config(_training_cfg())
    check_training_config(_training_cfg(run_val_every_n_steps=5, dataset_val={"_component_": "x.y"}))


def test_every_problem_is_reported_at_once_each_at_its_key():
    cfg = _training_cfg(
        gradient_accumulation_steps=0, log_every_n_steps=0, save_every_n_steps=-1, run_val_every_n_steps=5
    )
    problems = _problems(cfg)
    assert [(p.key, p.message) for p in problems] == [
        ("gradient_accumulation_steps", "must be an integer >= 1"),
        ("log_every_n_steps", "must be an integer >= 1"),
        ("save_every_n_steps", "must be a positive integer, or null to turn it off"),
        ("dataset_val", "is missing: run_val_every_n_steps needs a dataset"),
    ]
    assert [p.value for p in problems[:3]] == [0, 0, -1]


@pytest.mark.parametrize(
    "key, value",
    [
        ("gradient_accumulation_steps", True),  # a bool is an int to Python, not a count to a user
        ("gradient_accumulation_steps", 2.0),
        ("gradient_accumulation_steps", None),
        ("log_every_n_steps", None),
        ("run_val_every_n_steps", 0),
        ("max_validation_steps", 0),
        ("save_every_n_steps", "10"),
    ],
)
def test_counts_must_be_positive_integers(key, value):
    cfg = _training_cfg(dataset_val={"_component_": "x.y"}, **{key: value})
    problems = _problems(cfg)
    assert [p.key for p in problems] == [key]


def test_a_missing_gradient_accumulation_steps_is_a_problem():
    cfg = OmegaConf.create({})
    apply_defaults(cfg, ["finetune"])
    assert [(p.key, p.value) for p in _problems(cfg)] == [("gradient_accumulation_steps", None)]


def test_optimizer_in_bwd_with_clipping_and_accumulation():
    problems = _problems(_training_cfg(optimizer_in_bwd=True, clip_grad_norm=1.0, gradient_accumulation_steps=4))
    (problem,) = problems
    assert problem.key == "optimizer_in_bwd"
    assert "clip_grad_norm=1.0" in problem.message and "gradient_accumulation_steps=4" in problem.message
    check_training_config(_training_cfg(optimizer_in_bwd=True))  # no clipping, no accumulation: fine


def test_optimizer_in_bwd_with_a_finetuning_schedule():
    schedule = [{"params": ["output"], "transition": {"after_steps": 2}}, {"params": ["layers.*"]}]
    problems = _problems(_training_cfg(optimizer_in_bwd=True, finetuning_schedule=schedule))
    assert [p.key for p in problems] == ["finetuning_schedule"]
    assert "cannot be combined with optimizer_in_bwd: True" in problems[0].message
    check_training_config(_training_cfg(finetuning_schedule=schedule))  # the schedule alone is fine


def test_optimizer_in_bwd_in_a_distributed_recipe():
    cfg = _training_cfg(optimizer_in_bwd=True)
    check_training_config(cfg)  # fine on one device
    (problem,) = _problems(cfg, distributed=True)
    assert problem.key == "optimizer_in_bwd" and problem.value is True
    assert problem.message.startswith("is not supported by the distributed recipes")


def test_a_bad_converter_order(components):
    cfg = _training_cfg(model_converters=[
        {"_component_": "tune.training.Int8DynActInt4WeightQATConverter"},
        {"_component_": f"{components}.PeftAdapters"},
    ])  # fmt: skip
    (problem,) = _problems(cfg)
    assert problem.key == "model_converters"
    assert "model_converters[1] (PeftAdapters, kind 'peft') must run before model_converters[0]" in problem.message
    check_training_config(_training_cfg(model_converters=list(reversed(cfg.model_converters))))


def test_converters_that_conflict_or_do_not_import():
    conflict = check_model_converters(OmegaConf.create([
        {"_component_": "tune.training.Int8DynActInt4WeightQATConverter"},
        {"_component_": "tune.training.Float8TrainingConverter"},
    ]))  # fmt: skip
    assert [p.key for p in conflict] == ["model_converters"] and "cannot be combined" in conflict[0].message
    missing = check_model_converters(OmegaConf.create([{"_component_": "tune.training.NoSuchConverter"}]))
    assert [p.key for p in missing] == ["model_converters[0]._component_"]
    assert check_model_converters(OmegaConf.create({"_component_": "x"})) == [
        ConfigProblem("model_converters", "must be a list of components", OmegaConf.create({"_component_": "x"}))
    ]
    assert check_model_converters(None) == [] and check_model_converters(OmegaConf.create([])) == []


def test_a_malformed_finetuning_schedule():
    cfg = _training_cfg(
        finetuning_schedule=[{"params": ["output"], "transition": {"after_bananas": 2}}, {"params": ["norm"]}]
    )
    (problem,) = _problems(cfg)
    assert problem.key == "finetuning_schedule"
    assert "finetuning_schedule[0].transition: unknown transition 'after_bananas'" in problem.message
    assert check_finetuning_schedule("auto", None) == []
    assert [p.key for p in check_finetuning_schedule("sometimes", None)] == ["finetuning_schedule"]
    assert [p.key for p in check_finetuning_schedule("auto", {"after_years": 1})] == ["finetuning_schedule"]


@pytest.mark.parametrize("value", [5, True, 0.5])
def test_a_finetuning_schedule_that_is_not_a_list_is_a_problem_not_a_crash(value):
    # a user's mistake in the YAML: reported at the key, like any other problem (STYLE.md 8: no traceback)
    assert [p.key for p in check_finetuning_schedule(value, None)] == ["finetuning_schedule"]


def test_settings_converters_and_schedule_problems_come_in_one_error():
    cfg = _training_cfg(
        log_every_n_steps=0,
        model_converters=[{"_component_": "tune.training.NoSuchConverter"}],
        finetuning_schedule=[{"params": ["output"]}, {"params": ["norm"]}],  # phase 0 lacks a transition
    )
    assert [p.key for p in _problems(cfg)] == [
        "log_every_n_steps",
        "model_converters[0]._component_",
        "finetuning_schedule",
    ]


def test_training_config_problems_leave_converters_and_schedule_to_their_own_checks():
    cfg = _training_cfg(
        model_converters=[{"_component_": "tune.training.NoSuchConverter"}],
        finetuning_schedule=[{"params": ["output"]}, {"params": ["norm"]}],
    )
    assert training_config_problems(cfg) == []


# ---------------------------------------------------------------------- validate_config with a real recipe


def test_validate_fills_the_defaults_of_a_built_in_recipe():
    # full_tiny.yaml (the config of the recipe integration tests) without the optional keys but its lr_scheduler,
    # which the recipe builds with config.instantiate_lr_scheduler (passing the optimizer and run length)
    problems = validate_config(FULL_TINY, FULL_RECIPE, [*FULL_TINY_PATHS, *(f"~{k}" for k in FULL_TINY_OPTIONAL)])
    assert [str(p) for p in problems] == []


def test_validate_fills_the_defaults_of_a_built_in_recipe_without_an_lr_scheduler():
    removed = [*FULL_TINY_OPTIONAL, "lr_scheduler"]
    problems = validate_config(FULL_TINY, FULL_RECIPE, [*FULL_TINY_PATHS, *(f"~{k}" for k in removed)])
    assert [str(p) for p in problems] == []


def test_the_defaults_come_from_the_recipe_info(tmp_path):
    # the same recipe without "optional_keys" reads keys that the config no longer has
    source = FULL_RECIPE.read_text()
    line = '    "optional_keys": ["finetune", "moe"],\n'
    assert line in source
    copy = tmp_path / "full_without_tables.py"
    copy.write_text(source.replace(line, ""))
    problems = validate_config(FULL_TINY, copy, [*FULL_TINY_PATHS, "~clip_grad_norm", "~lr_scheduler"])
    assert "clip_grad_norm" in [p.key for p in problems]
    assert "missing: the recipe reads it" in next(p.message for p in problems if p.key == "clip_grad_norm")


def test_validate_reports_the_training_settings_of_a_built_in_recipe():
    problems = validate_config(
        FULL_TINY, FULL_RECIPE, [*FULL_TINY_PATHS, "~clip_grad_norm", "gradient_accumulation_steps=0"]
    )
    assert [str(p) for p in problems] == ["gradient_accumulation_steps = 0: must be an integer >= 1"]


def test_validate_reports_optimizer_in_bwd_for_a_distributed_recipe():
    overrides = [*FULL_TINY_PATHS, "optimizer_in_bwd=True"]
    assert validate_config(FULL_TINY, FULL_RECIPE, overrides) == []
    problems = validate_config(FULL_TINY, FULL_DISTRIBUTED_RECIPE, overrides)
    assert [p.key for p in problems] == ["optimizer_in_bwd"]
    assert "is not supported by the distributed recipes" in problems[0].message


def test_validate_reports_an_unset_mandatory_optional_key():
    problems = validate_config(FULL_TINY, FULL_RECIPE, [*FULL_TINY_PATHS, "clip_grad_norm=???"])
    assert [p.key for p in problems] == ["clip_grad_norm"]
    assert "mandatory value not set" in problems[0].message


# ------------------------------------------------------------------------------------ the LR scheduler


def _optimizer(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=lr)


def _lrs(optimizer, scheduler, num_steps: int) -> list[float]:
    rates = []
    for _ in range(num_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_a_warmup_schedule_gets_the_run_length():
    node = OmegaConf.create({
        "_component_": "tune.training.lr_schedulers.get_cosine_schedule_with_warmup", "num_warmup_steps": 2
    })  # fmt: skip
    optimizer = _optimizer()
    scheduler = instantiate_lr_scheduler(node, optimizer, num_training_steps=10)
    reference = _optimizer()  # the reference semantics: transformers' schedule given the same 10 steps
    expected = _lrs(reference, transformers.get_cosine_schedule_with_warmup(reference, 2, 10), 12)
    assert _lrs(optimizer, scheduler, 12) == pytest.approx(expected, abs=1e-12)


def test_a_configured_num_training_steps_is_kept():
    node = OmegaConf.create(
        {
            "_component_": "tune.training.lr_schedulers.get_linear_schedule_with_warmup",
            "num_warmup_steps": 2,
            "num_training_steps": 30,
        }
    )
    optimizer = _optimizer()
    scheduler = instantiate_lr_scheduler(node, optimizer, num_training_steps=10)
    reference = _optimizer()
    expected = _lrs(reference, transformers.get_linear_schedule_with_warmup(reference, 2, 30), 12)
    assert _lrs(optimizer, scheduler, 12) == pytest.approx(expected, abs=1e-12)


def test_a_torch_scheduler_gets_only_its_own_arguments():
    node = OmegaConf.create({"_component_": "torch.optim.lr_scheduler.StepLR", "step_size": 2, "gamma": 0.5})
    optimizer = _optimizer()
    scheduler = instantiate_lr_scheduler(node, optimizer, num_training_steps=10)
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    reference = _optimizer()
    expected = _lrs(reference, torch.optim.lr_scheduler.StepLR(reference, step_size=2, gamma=0.5), 6)
    assert _lrs(optimizer, scheduler, 6) == pytest.approx(expected)  # 0.1, 0.1, 0.05, 0.05, 0.025, 0.025


def test_no_lr_scheduler_is_none():
    assert instantiate_lr_scheduler(None, _optimizer(), num_training_steps=10) is None


def test_an_lr_scheduler_that_does_not_import_is_a_config_error():
    node = OmegaConf.create({"_component_": "torch.optim.lr_scheduler.StepLRR", "step_size": 2})
    with pytest.raises(ConfigError) as info:
        instantiate_lr_scheduler(node, _optimizer(), num_training_steps=10)
    assert info.value.problems[0].key == "lr_scheduler._component_"


# ----------------------------------------------------------------------------------- tensor-parallel plan


def test_a_configured_plan_gets_the_model_when_it_takes_it(components):
    model = nn.Linear(2, 2)
    node = OmegaConf.create({"_component_": f"{components}.plan_for_model", "style": "sequence"})
    assert instantiate_tensor_parallel_plan(node, model, "LLAMA3_2") == {"model": model, "style": "sequence"}
    node = OmegaConf.create({"_component_": f"{components}.plan_without_model"})
    assert instantiate_tensor_parallel_plan(node, model, "LLAMA3_2") == {"style": "rowwise"}


def test_without_a_configured_plan_the_family_plan_is_used():
    from tune.models._parallel import base_llama_tp_plan
    from tune.models.llama3_2 import llama3_2

    model = llama3_2(vocab_size=32, num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=16,
                     intermediate_dim=32, tie_word_embeddings=False)  # fmt: skip
    plan = instantiate_tensor_parallel_plan(None, model, "LLAMA3_2")
    expected = base_llama_tp_plan(model)
    assert sorted(plan) == sorted(expected)
    assert [type(plan[k]) for k in sorted(plan)] == [type(expected[k]) for k in sorted(expected)]
    with pytest.raises(ValueError, match="'GEMMA2' .* registers no tensor-parallel plan"):
        instantiate_tensor_parallel_plan(None, model, "GEMMA2")


# ------------------------------------------------------------------------------------------- the collator


SAMPLES = [
    {"tokens": [1, 10, 11], "labels": [1, 10, 11]},
    {"tokens": [1, 20, 21, 22, 23], "labels": [-100, 20, 21, 22, 23]},
]


def test_the_default_collator_off_cpu_pads_with_the_given_ids():
    collate = instantiate_collate(None, ListDataset(SAMPLES), padding_idx=7, ignore_idx=-5, device_type="cuda")
    batch = collate(SAMPLES)
    assert batch["tokens"].tolist() == [[1, 10, 11, 7, 7], [1, 20, 21, 22, 23]]
    assert batch["labels"].tolist() == [[1, 10, 11, -5, -5], [-100, 20, 21, 22, 23]]


def test_the_default_collator_on_cpu_is_padding_free():
    collate = instantiate_collate(None, ListDataset(SAMPLES), padding_idx=7, ignore_idx=-5, device_type="cpu")
    batch = collate(SAMPLES)
    # one row of 3 + 5 tokens; each sample's first label is ignore_idx so no loss crosses from one to the next
    assert batch["tokens"].tolist() == [[1, 10, 11, 1, 20, 21, 22, 23]]
    assert batch["labels"].tolist() == [[-5, 10, 11, -5, 20, 21, 22, 23]]
    assert batch["input_pos"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]


def test_padded_collate_sft_on_a_packed_dataset_collates_packs():
    packed = PackedDataset(ListDataset(SAMPLES), max_seq_len=10)
    collate = instantiate_collate("tune.data.padded_collate_sft", packed, padding_idx=0, ignore_idx=-100)
    batch = collate([packed[0]])
    assert sorted(batch) == ["input_pos", "labels", "mask", "tokens"]
    assert batch["input_pos"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]  # documents of 3 and 5, 2 padding


def test_padded_collate_packed_on_an_unpacked_dataset_is_a_config_error_at_collate_fn():
    with pytest.raises(ConfigError) as info:
        instantiate_collate("tune.data.padded_collate_packed", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100)
    (problem,) = info.value.problems
    assert (problem.key, problem.value) == ("collate_fn", "tune.data.padded_collate_packed")
    assert "needs a packed dataset" in problem.message


def test_a_mix_of_packed_and_unpacked_datasets_is_a_config_error_at_collate_fn():
    mixed = torch.utils.data.ConcatDataset([PackedDataset(ListDataset(SAMPLES), max_seq_len=10), ListDataset(SAMPLES)])
    with pytest.raises(ConfigError) as info:
        instantiate_collate(None, mixed, padding_idx=0, ignore_idx=-100)
    assert info.value.problems[0].key == "collate_fn" and "mixes packed and unpacked" in str(info.value)


def test_a_collate_fn_that_does_not_import_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        instantiate_collate("tune.data.padded_colate_sft", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100)
    assert info.value.problems[0].key == "collate_fn"


def test_a_component_node_builds_a_collator_class(components):
    node = OmegaConf.create({"_component_": f"{components}.FixedLengthCollator", "length": 16})
    collate = instantiate_collate(node, ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100)
    assert type(collate).__name__ == "FixedLengthCollator" and collate.length == 16
    assert collate(SAMPLES) == {"num_samples": 2, "length": 16}  # used as built: no ids bound, no pack switch


def test_padding_free_collate_gets_max_seq_len():
    collate = instantiate_collate(
        "tune.data.padding_free_collate", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, max_seq_len=6
    )
    # 3 + 5 tokens do not fit in one row of 6: the padded fallback
    assert collate(SAMPLES)["tokens"].shape == (2, 5)
    collate = instantiate_collate(
        "tune.data.padding_free_collate", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, max_seq_len=8
    )
    assert collate(SAMPLES)["tokens"].shape == (1, 8)


def test_the_cpu_hint_is_logged_for_a_configured_padded_collator_only(caplog):
    with caplog.at_level(logging.INFO, logger="tune"):
        instantiate_collate(
            "tune.data.padded_collate_sft", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, device_type="cpu"
        )
    assert "tune.data.padding_free_collate puts each batch in one row" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tune"):
        instantiate_collate(None, ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, device_type="cpu")
        instantiate_collate(
            "tune.data.padded_collate_sft", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, device_type="cuda"
        )
        instantiate_collate(
            "tune.data.padding_free_collate", ListDataset(SAMPLES), padding_idx=0, ignore_idx=-100, device_type="cpu"
        )
    assert "padding_free_collate puts each batch" not in caplog.text
    assert "collate_fn: null -> tune.data.padding_free_collate on cpu" in caplog.text  # what the default chose


# --------------------------------------------------------------------------- KeepDefault and the "grpo" table

GRPO_RECIPE = REPO / "recipes" / "grpo_full_finetune_distributed.py"
GRPO_CONFIG = REPO / "configs" / "qwen3" / "4B_full_grpo.yaml"


def _grpo_cfg(**values):
    """A GRPO config as the distributed GRPO recipe sees it: the "finetune", "distributed" and "grpo" defaults."""
    reward = {"_component_": "tune.rlhf.AnswerReward"}
    required = {"grpo_samples": 4, "forward_batch_size": 4, "max_generated_tokens": 8, "reward_functions": [reward]}
    cfg = OmegaConf.create({**required, **values})
    apply_defaults(cfg, ["finetune", "distributed", "grpo"])
    return cfg


def test_keep_default_refuses_any_value_but_the_tables_default():
    tables = ["finetune", "distributed", "grpo"]
    unsupported = {
        "tensor_parallel_dim": KeepDefault("this recipe shards with FSDP2 only"),
        "gradient_accumulation_steps": KeepDefault("nothing to accumulate"),
        "compile": "shapes change",
    }
    check_training_config(_grpo_cfg(tensor_parallel_dim=1), tables=tables, unsupported=unsupported)  # the default
    with pytest.raises(ConfigError) as info:
        check_training_config(
            _grpo_cfg(tensor_parallel_dim=2, gradient_accumulation_steps=4), tables=tables, unsupported=unsupported
        )
    assert [str(p) for p in info.value.problems] == [
        "tensor_parallel_dim = 2: must be 1 in this recipe (this recipe shards with FSDP2 only); set it to 1 or "
        "remove it",
        "gradient_accumulation_steps = 4: must be 1 in this recipe (nothing to accumulate); set it to 1 or remove it",
    ]
    # a plain reason still refuses anything but null or False
    with pytest.raises(ConfigError, match="compile = True: is not supported by this recipe"):
        check_training_config(_grpo_cfg(compile=True), tables=tables, unsupported=unsupported)


def test_keep_default_of_a_key_no_table_has_is_the_recipes_mistake():
    with pytest.raises(ValueError, match="keeps the default of 'tensor_parallel_dim', which none of the tables"):
        check_training_config(_training_cfg(), unsupported={"tensor_parallel_dim": KeepDefault("why")})


def test_grpo_table_fills_its_defaults_and_checks_its_keys_all_at_once():
    cfg = _grpo_cfg()
    assert {k: cfg[k] for k in OPTIONAL_KEYS["grpo"]} == OPTIONAL_KEYS["grpo"]
    assert cfg.ppo_epochs == 1 and cfg.gradient_accumulation_steps == 1 and cfg.reward_weights is None
    check_training_config(cfg, tables=["finetune", "distributed", "grpo"])
    bad = _grpo_cfg(grpo_samples=1, forward_batch_size=0, ppo_epochs=True, reward_weights=[1.0, 2.0])
    del bad["max_generated_tokens"]
    assert [(p.key, p.message) for p in table_problems(bad, ["finetune", "grpo"])] == [
        ("grpo_samples", "must be an integer >= 2"),
        ("ppo_epochs", "must be an integer >= 1"),
        ("forward_batch_size", "must be an integer >= 1"),
        ("max_generated_tokens", "must be an integer >= 1"),
        ("reward_weights", "has 2 entries for 1 reward functions: one each, or null for 1 each"),
    ]
    assert table_problems(bad, ["finetune"]) == []  # the checks belong to the "grpo" table
    (problem,) = table_problems(_grpo_cfg(reward_functions=[]), ["grpo"])
    assert problem.key == "reward_functions" and problem.message.startswith("must be a non-empty list")
    (problem,) = table_problems(_grpo_cfg(reward_weights=0.5), ["grpo"])
    assert problem.key == "reward_weights" and "must be a list of one weight per reward function" in problem.message


def test_validate_runs_the_grpo_checks_of_a_grpo_recipe():
    assert validate_config(GRPO_CONFIG, GRPO_RECIPE) == []
    problems = validate_config(GRPO_CONFIG, GRPO_RECIPE, ["grpo_samples=1", "reward_weights=[1.0]"])
    assert [(p.key, p.message) for p in problems] == [
        ("grpo_samples", "must be an integer >= 2"),
        ("reward_weights", "has 1 entries for 2 reward functions: one each, or null for 1 each"),
    ]
