"""Every shipped config runs end to end at tiny scale in some test tier (issue 26: what ships is what is tested).

The configs another test already runs are computed from the tables those tests parametrize over
(``RUN_ELSEWHERE``); each remaining training config is copied as shipped and run here for 2 steps on its family's
tiny assets (tests/recipes/_family_assets.py: the family's component builder at tiny dimensions, a tiny tokenizer of
its kind, tiny alpaca JSON, ``device=cpu dtype=fp32``), then its checkpoint is checked: written, with finite weights,
after finite losses. The sizes of one family share its tiny model (the smallest shipped size's settings), so what a
run here checks is the rest of the config: recipe, optimizer, scheduler, loss, checkpointer, memory settings.
The generation, evaluation and quantisation configs run here too, on the tiny Llama 3.2 assets their model names.

Most runs are ``slow`` (``make test-all``); ``DEFAULT_TIER`` is a sample of kinds no default-tier test runs yet.
``test_every_shipped_config_is_run_somewhere`` fails when a new config is neither run elsewhere nor here.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.recipes import _family_assets as assets
from tests.recipes import (
    test_grpo_every_family,
    test_ppo_shipped_configs,
    test_reward_model_distributed,
    test_reward_model_single_device,
    test_vision_gemma3,
    test_vision_llama3_2_vision,
    test_vision_qwen2_5_vl,
)
from tests.recipes.dist_utils import run_distributed
from tests.recipes.test_every_family import family_assets  # noqa: F401 - a fixture
from tests.recipes.utils import ROOT, mc_task_yaml, read_jsonl, run_recipe
from tune.config import builtin_configs, recipes_for_config
from tune.models.llama3 import llama3_tokenizer

pytestmark = pytest.mark.integration

NUM_STEPS = 2
SHIPPED = builtin_configs()  # name (``qwen3/8B_lora``) -> file


def _name(relative: str) -> str:
    return relative.removesuffix(".yaml")


def _run_elsewhere() -> dict[str, str]:
    """Shipped config name -> the test that runs it end to end, from the tables those tests parametrize over."""
    every_family = "test_every_family.py"
    found: dict[str, str] = {}
    for spec in assets.FAMILIES.values():
        for relative in [*spec.configs.values(), *spec.distributed.values()]:
            found[_name(relative)] = every_family
    for kinds in assets.DIST_POST_TRAINING_CONFIGS.values():
        found.update(dict.fromkeys(map(_name, kinds.values()), every_family))
    found.update(dict.fromkeys((_name(relative) for relative, _ in assets.DPO_CONFIGS.values()), every_family))
    found.update(dict.fromkeys(map(_name, assets.KD_CONFIGS.values()), every_family))
    kto = [relative for cases in assets.KTO_CONFIGS.values() for relative, _ in cases]
    found.update(dict.fromkeys(map(_name, kto), "test_kto_every_family.py"))
    reward = test_reward_model_single_device.SHIPPED_CONFIGS
    found.update(dict.fromkeys(map(_name, reward), "test_reward_model_single_device.py"))
    reward_distributed = test_reward_model_distributed.SHIPPED_CONFIGS
    found.update(dict.fromkeys(map(_name, reward_distributed), "test_reward_model_distributed.py"))
    orpo = (_name(relative) for _, relative, _ in assets.ORPO_CONFIGS)
    found.update(dict.fromkeys(orpo, "test_orpo_every_family.py"))
    found.update(dict.fromkeys(map(_name, test_ppo_shipped_configs.CASES.values()), "test_ppo_shipped_configs.py"))
    grpo = [relative for *_, relative in test_grpo_every_family.CASES + test_grpo_every_family.DIST_CASES]
    found.update(dict.fromkeys(map(_name, grpo), "test_grpo_every_family.py"))
    # the vision families' configs, each run by its family's test; their generation configs by test_generate_vision.py
    for module in (test_vision_gemma3, test_vision_qwen2_5_vl, test_vision_llama3_2_vision):
        found.update(dict.fromkeys(module.CONFIGS, module.__name__.rpartition(".")[2] + ".py"))
    for name in ("gemma3_vision/4B_generation", "qwen2_5_vl/3B_generation", "llama3_2_vision/11B_generation_v2"):
        found[name] = "test_generate_vision.py"
    # the vision evaluation config, run on each vision family's tiny model with a local task with images
    found["llama3_2_vision/11B_evaluation"] = "test_eleuther_eval_vision.py"
    # the demo's configs, as demo/run_demo.sh (test_demo.py) and demo/run_demo_rl.sh (test_grpo_learns.py) run them
    for script, test in (
        ("run_demo.sh", "test_demo.py"),
        ("run_demo_rl.sh", "test_grpo_learns.py"),
        ("run_demo_vision.sh", "test_demo_vision.py"),
        ("run_demo_rlhf.sh", "test_rlhf_pipeline_demo.py"),
    ):
        for name in re.findall(r"--config ([\w./-]+)", (ROOT / "demo" / script).read_text()):
            found.setdefault(name, test)
    return found


RUN_ELSEWHERE = _run_elsewhere()

TRAINING_RECIPES = {
    "full_finetune_single_device": "full",
    "lora_finetune_single_device": "lora",
    "full_finetune_distributed": "full",
    "lora_finetune_distributed": "lora",
}
# the configs that are not training runs, each run here by its own test
OTHER_CASES = {"generation": "generate", "quantization": "quantize", "eleuther_evaluation": "eleuther_eval"}


def _recipe(name: str) -> str:
    (recipe,) = recipes_for_config(name)
    return recipe.name


CASES = sorted(name for name in SHIPPED if name not in RUN_ELSEWHERE and _recipe(name) in TRAINING_RECIPES)

# Kinds of config no default-tier test ran before (with the generation, quantisation and evaluation configs, which
# run in the default tier): a Gemma 3 size above 1B whose full fine-tune steps the optimizer in the backward pass
# (optimizer_in_bwd, as every 7B-9B full single-device config), and a large-size QLoRA config (rank 64, activation
# checkpointing, as every 7B+ LoRA/QLoRA single-device config). The distributed configs all run slow.
DEFAULT_TIER = {"gemma3/4B_full_single_device", "gemma3/27B_qlora_single_device"}

# Overrides beyond dimensions, tokenizer, data, paths, device, dtype and run length that a shipped config needs to
# run at tiny scale on CPU, with the reason (each one a finding about that config); empty where none was needed.
CPU_OVERRIDES: dict[str, list[str]] = {}


def _family(name: str) -> str:
    """The ``assets.FAMILIES`` key of a config: that of the longest size prefix the families' own configs share with
    it (``mistral/nemo_12B_*`` -> ``mistral_nemo``), else its directory (``qwen2_5/7B_*`` -> ``qwen2_5``)."""
    sizes = {}
    for family, spec in assets.FAMILIES.items():
        for method, relative in [*spec.configs.items(), *spec.distributed.items()]:
            size = _name(relative).removesuffix("_single_device").removesuffix(f"_{method}")
            sizes[f"{size}_"] = family
    matches = [size for size in sizes if name.startswith(size)]
    return sizes[max(matches, key=len)] if matches else name.split("/")[0]


def _method(name: str) -> str:
    stem = name.split("/")[1]
    return "qlora" if "_qlora" in stem else TRAINING_RECIPES[_recipe(name)]


def _copy_config(name: str, destination: Path) -> Path:
    """The shipped config, copied byte for byte (what ``tune cp`` writes)."""
    path = destination / SHIPPED[name].name
    shutil.copyfile(SHIPPED[name], path)
    return path


def _tiny_overrides(name: str, data: Path, out: Path) -> list[str]:
    """The tiny-run changes (as test_every_family.py), for ``NUM_STEPS`` steps in one epoch."""
    family = _family(name)
    return [
        *assets.tiny_run_overrides(family, _method(name), data, out, NUM_STEPS),
        "epochs=1",
        *CPU_OVERRIDES.get(name, []),
    ]


def _check_run(out: Path, lora: bool) -> None:
    """Losses of steps 1..NUM_STEPS logged and finite; ``step_NUM_STEPS`` holds finite weights (and the adapter)."""
    (log,) = (out / "logs").glob("*.jsonl")
    losses = {r["step"]: r["loss"] for r in read_jsonl(log) if "loss" in r}
    assert sorted(losses) == list(range(1, NUM_STEPS + 1)), losses
    assert all(torch.isfinite(torch.tensor(list(losses.values())))), losses
    final = out / f"step_{NUM_STEPS}"
    files = [*final.glob("*.safetensors"), *(final / "adapter").glob("*.safetensors")] if final.is_dir() else []
    assert any(f.parent == final for f in files), f"no model weights in {final}"
    assert not lora or any(f.parent.name == "adapter" for f in files), f"no adapter in {final}"
    for file in files:
        for key, tensor in load_file(file).items():
            assert torch.isfinite(tensor).all(), (file, key)


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n, marks=() if n in DEFAULT_TIER else pytest.mark.slow) for n in CASES]
)
def test_shipped_config_trains_and_saves(family_assets, tmp_path, name):  # noqa: F811
    data = family_assets(_family(name))
    config = _copy_config(name, tmp_path)
    recipe = _recipe(name)
    out = tmp_path / "run"
    overrides = _tiny_overrides(name, data, out)
    if recipe.endswith("_distributed"):
        run_distributed(recipe, config, overrides, cwd=tmp_path)
    else:
        run_recipe(recipe, config, overrides, cwd=tmp_path, timeout=300)
    _check_run(out, lora=_method(name) != "full")


def _llama3_2_overrides(data: Path, out: Path) -> list[str]:
    """The generation, evaluation and quantisation configs name Llama 3.2 1B: its tiny model, checkpoint, tokenizer."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *assets.model_overrides("llama3_2", "full"),
        f"checkpointer.checkpoint_dir={data / 'hf'}",
    ]


def _tokenizer_path() -> str:
    return f"tokenizer.path={assets.tokenizer_file(assets.FAMILIES['llama3_2'].tokenizer)}"


def test_shipped_generation_config_generates(family_assets, tmp_path):  # noqa: F811
    data = family_assets("llama3_2")
    config = _copy_config("generation", tmp_path)
    overrides = [*_llama3_2_overrides(data, tmp_path / "out"), _tokenizer_path()]
    proc = run_recipe(OTHER_CASES["generation"], config, overrides, cwd=tmp_path, timeout=300)
    assert "Generated" in proc.stderr + proc.stdout


def test_shipped_quantization_config_quantizes(family_assets, tmp_path):  # noqa: F811
    data = family_assets("llama3_2")
    config = _copy_config("quantization", tmp_path)
    # the shipped eval_tokens are ids of the real Llama 3 vocabulary (128000 = <|begin_of_text|>), outside the tiny
    # one: the same sentence in the tiny tokenizer's ids
    tokenizer = llama3_tokenizer(str(assets.tokenizer_file(assets.FAMILIES["llama3_2"].tokenizer)))
    tokens = tokenizer.encode("The quick brown fox jumps over the lazy dog.", add_eos=False)
    out = tmp_path / "out"
    overrides = [*_llama3_2_overrides(data, out), f"eval_tokens={json.dumps(tokens)}"]
    proc = run_recipe(OTHER_CASES["quantization"], config, overrides, cwd=tmp_path, timeout=300)
    assert "argmax agreement" in proc.stderr + proc.stdout  # the eval_tokens check ran
    (saved,) = out.glob("model_*.pt")
    assert torch.load(saved, weights_only=False), saved


def test_shipped_eleuther_evaluation_config_evaluates(family_assets, tmp_path):  # noqa: F811
    pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")
    data = family_assets("llama3_2")
    config = _copy_config("eleuther_evaluation", tmp_path)
    # a local multiple-choice task on questions written here: the shipped task (truthfulqa_mc2) downloads its data
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = [{"question": f"{a} + 3 =", "choices": [str(a + 3), str(a + 4), str(a)], "label": 0} for a in range(8)]
    (tasks / "sums.jsonl").write_text("\n".join(map(json.dumps, rows)))
    (tasks / "tiny_sum_mc.yaml").write_text(mc_task_yaml("tiny_sum_mc", tasks / "sums.jsonl"))
    out = tmp_path / "out"
    overrides = [*_llama3_2_overrides(data, out), _tokenizer_path(), f"include_path={tasks}", "tasks=[tiny_sum_mc]"]
    run_recipe(OTHER_CASES["eleuther_evaluation"], config, overrides, cwd=tmp_path, timeout=300)
    results = json.loads((out / "eleuther_eval_results.json").read_text())
    assert 0.0 <= results["tiny_sum_mc"]["acc,none"] <= 1.0


def test_every_shipped_config_is_run_somewhere():
    # a new config must be run by a test: one of the tables RUN_ELSEWHERE reads, or CASES / OTHER_CASES here
    here = set(CASES) | set(OTHER_CASES)
    not_run = sorted(set(SHIPPED) - set(RUN_ELSEWHERE) - here)
    assert not not_run, f"shipped configs no test runs: {not_run}"
    assert not set(RUN_ELSEWHERE) - set(SHIPPED), "a table names a config that is not shipped"
    assert not set(RUN_ELSEWHERE) & here, "a config run elsewhere is run here too"
    for name in OTHER_CASES:
        assert _recipe(name) == OTHER_CASES[name], name
    for name in CASES:
        assert _family(name) in assets.FAMILIES, f"{name}: no tiny assets for its family {_family(name)!r}"
    assert DEFAULT_TIER <= set(CASES)
    print(f"{len(SHIPPED)} shipped configs: {len(RUN_ELSEWHERE)} run elsewhere, {len(here)} here")
