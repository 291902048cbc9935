"""Every family's shipped configs, end to end: train, resume, and load the outputs in transformers and PEFT.

Each case copies a shipped config as ``tune cp`` gives it and changes it only on the command line: tiny model
dimensions (``model.*``, the family's component builder), a tiny tokenizer of the family's kind, a tiny alpaca
JSON file, paths, and the CPU settings (``device=cpu dtype=fp32``); anything else the shipped config needed to
run is listed in ``CPU_OVERRIDES`` with the reason. The config's own seed setting (``seed: null``) and its
shuffling, accumulation, scheduler and optimizer are kept.

What is checked, per (family, method):

- train: 4 steps, a checkpoint after each;
- resume: from the step-2 checkpoint, the losses of steps 3 and 4 equal the uninterrupted run's, and so do the
  final weights (every shipped single-device, DPO and KD config in the default tier);
- transformers: ``AutoModelForCausalLM.from_pretrained(step_4)`` loads with no missing, unexpected or resized
  weight;
- PEFT (LoRA, QLoRA): ``PeftModel.from_pretrained(base, step_4/adapter)`` gives the merged checkpoint's logits.
  The base is the input checkpoint, with QLoRA's adapted weights passed through the NF4 round trip (QLoRA trains
  the adapter on the quantised base, and the merged checkpoint is that base plus the adapter). The LoRA runs
  start from a random PEFT adapter (``checkpointer.adapter_checkpoint``) so that after 4 warm-up steps of the
  shipped schedule the adapter still changes the logits far beyond the tolerance.

The distributed configs (2 gloo ranks) run the same checks; ``DEFAULT_TIER_DIST`` says which are in the default tier.
"""

import functools
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

RECIPES = {"full": "full_finetune_single_device", "lora": "lora_finetune_single_device"}
DIST_RECIPES = {"full": "full_finetune_distributed", "lora": "lora_finetune_distributed"}
# the multi-GPU post-training configs (assets.DIST_POST_TRAINING_CONFIGS): kind -> (recipe, the model's method)
DIST_POST_TRAINING = {
    "lora_dpo": ("lora_dpo_distributed", "lora"),
    "full_dpo": ("full_dpo_distributed", "full"),
    "kd": ("knowledge_distillation_distributed", "lora"),
}
NUM_STEPS, RESUME_FROM = 4, 2

# Overrides beyond dimensions, tokenizer, data, paths, device and dtype that the shipped configs need on CPU
# (each one a finding about the shipped configs; empty where none was needed).
CPU_OVERRIDES: list[str] = []

SINGLE_CASES = [(family, method) for family, spec in assets.FAMILIES.items() for method in spec.configs]
DIST_CASES = [(family, method) for family, spec in assets.FAMILIES.items() for method in spec.distributed]
DIST_CASES += [(family, kind) for family, kinds in assets.DIST_POST_TRAINING_CONFIGS.items() for kind in kinds]
# What no family ships (reported, not tested): llama3_3 has no single-device full or LoRA config; llama3_2,
# mistral and phi3 have no distributed configs.
MISSING_SINGLE = [(f, m) for f, s in assets.FAMILIES.items() for m in ("full", "lora", "qlora") if m not in s.configs]


@pytest.fixture(scope="session")
def family_assets(tmp_path_factory):
    """family -> its tiny assets directory (``hf/`` and ``train.json``), each built once per session."""
    root = tmp_path_factory.mktemp("family_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")

    @functools.cache
    def build(family: str) -> Path:
        return assets.build_family_assets(family, root / family)

    return build


def _copy_config(relative: str, destination: Path) -> Path:
    """The shipped config, copied byte for byte (what ``tune cp`` writes)."""
    path = destination / Path(relative).name
    shutil.copyfile(assets.CONFIGS / relative, path)
    return path


def _overrides(family: str, method: str, data: Path, out: Path, adapter: Path | None) -> list[str]:
    overrides = [
        *assets.tiny_run_overrides(family, method, data, out, NUM_STEPS),
        "save_every_n_steps=1",
        *CPU_OVERRIDES,
    ]
    if adapter is not None:
        overrides.append(f"checkpointer.adapter_checkpoint={adapter}")
    return overrides


def _crashed_copy(out: Path, where: Path) -> Path:
    """A copy of the output directory as a crash after step 2 leaves it: later checkpoints (and the distributed
    recipes' ``dcp/step_N``) and the log removed."""
    shutil.copytree(out, where)
    shutil.rmtree(where / "logs")
    for later in range(RESUME_FROM + 1, NUM_STEPS + 1):
        for path in (where / f"step_{later}", where / "dcp" / f"step_{later}"):
            if path.exists():
                shutil.rmtree(path)
    return where


def _losses(out: Path) -> dict[int, float]:
    """Step -> training loss, from the run's JSONL log (the shipped configs name it ``log_<unix time>.jsonl``)."""
    (log,) = (out / "logs").glob("*.jsonl")
    return {r["step"]: r["loss"] for r in read_jsonl(log) if "loss" in r}


def _lora_node(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["model"]


def _initial_adapter(family: str, base_dir: Path, lora: dict, where: Path) -> Path | None:
    """A PEFT adapter with random A and B (both non-zero) for the config's LoRA settings; None for Phi-3, whose
    fused ``qkv_proj`` / ``gate_up_proj`` cannot carry tune's separate q/v and gate/up adapters in PEFT's form."""
    if family in ("phi3", "phi3_128k", "phi4"):
        return None
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=lora["lora_rank"],
        lora_alpha=lora["lora_alpha"],
        lora_dropout=0.0,
        target_modules=assets.hf_lora_targets(lora),
        init_lora_weights=False,  # random B as well as A: the adapter changes the model from the first step
    )
    torch.manual_seed(1)
    peft_model = get_peft_model(base, config)
    with torch.no_grad():  # PEFT's random B is as large as A; smaller keeps the tiny model's losses sane
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.1)
    peft_model.save_pretrained(where)
    return where


def _load_strict(directory: Path):
    """``AutoModelForCausalLM.from_pretrained`` asserting that every weight was found and used as saved."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"{directory}: {problems}"
    return model.eval()


def _probe_tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(3, vocab_size, (2, 24), generator=torch.Generator().manual_seed(7))


def _check_peft(family: str, method: str, data: Path, step_dir: Path, lora: dict) -> None:
    from peft import PeftModel

    merged = _load_strict(step_dir)
    base = _load_strict(data / "hf")
    if method == "qlora":  # the base QLoRA trained on: its adapted weights quantised to NF4 and back
        rows = assets.quantized_rows(family, lora)
        with torch.no_grad():
            for name, module in base.named_modules():
                for part in rows.get(name.rsplit(".", 1)[-1], []):
                    module.weight[part] = assets.nf4_round_trip(module.weight[part])
        assets.nf4_round_trip_experts(base)  # QLoRA keeps every expert in NF4 (MoE families; others: no-op)
    tokens = _probe_tokens(base.config.vocab_size)
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        adapted = PeftModel.from_pretrained(base, step_dir / "adapter").eval()
        peft_logits = adapted(input_ids=tokens).logits
        merged_logits = merged(input_ids=tokens).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-4, rtol=1e-4)
    # the comparison means something only where the adapter moves the logits far beyond that tolerance
    if family not in ("phi3", "phi3_128k", "phi4"):
        assert (peft_logits - base_logits).abs().max() > 1e-2


# QLoRA differs from LoRA in the base weights alone (NF4), the same in every family: three families' QLoRA configs
# run in the default tier (dense, MoE, and Gemma 3's tied embeddings), the others in the slow tier
DEFAULT_TIER_QLORA = {"llama3_1", "qwen3_moe", "gemma3"}


def _resume_params() -> list:
    """(family, method, resume) per shipped single-device config: each trains, loads in transformers (and PEFT)
    and resumes (a tiny run forks from tests/recipes/_zygote.py: ~3 s); full and LoRA of every family in the
    default tier, QLoRA of DEFAULT_TIER_QLORA."""
    return [
        pytest.param(
            family,
            method,
            True,
            id=f"{family}-{method}",
            marks=pytest.mark.slow if method == "qlora" and family not in DEFAULT_TIER_QLORA else (),
        )
        for family, method in SINGLE_CASES
    ]


@pytest.mark.parametrize("family, method, resume", _resume_params())
def test_shipped_single_device_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family, method, resume):
    spec = assets.FAMILIES[family]
    data = family_assets(family)
    config = _copy_config(spec.configs[method], tmp_path)
    lora = _lora_node(config) if method != "full" else None
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter") if lora else None
    recipe = RECIPES["full" if method == "full" else "lora"]

    # train: 4 steps, a checkpoint after each
    out = tmp_path / "run"
    run_recipe(recipe, config, _overrides(family, method, data, out, adapter), cwd=tmp_path, timeout=300)
    uninterrupted = _losses(out)
    assert sorted(uninterrupted) == list(range(1, NUM_STEPS + 1))
    assert all(torch.isfinite(torch.tensor(list(uninterrupted.values()))))
    final = out / f"step_{NUM_STEPS}"

    # transformers (and PEFT) load what was written
    trained = _load_strict(final)
    if lora is not None:
        _check_peft(family, method, data, final, lora)

    if not resume:
        return
    # resume, with the config's own seed setting, from a copy holding the run only up to step 2
    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    overrides = _overrides(family, method, data, resumed_out, adapter)
    run_recipe(recipe, config, [*overrides, "resume_from_checkpoint=True"], cwd=tmp_path, timeout=300)
    _check_resumed(resumed_out, uninterrupted, trained)


# the distributed configs that run in the default tier (2 gloo ranks, ~15 s each): a dense LoRA config and an MoE
# full config (experts sharded); every family's configs run single-device in the default tier (Gemma 3's, the family
# with the most kinds of layers, among them), and its distributed configs in the slow tier (`make test-all`)
DEFAULT_TIER_DIST = {("llama2", "lora"), ("qwen3_moe", "full")}


@pytest.mark.parametrize(
    "family, method",
    [
        pytest.param(f, m, id=f"{f}-{m}", marks=() if (f, m) in DEFAULT_TIER_DIST else pytest.mark.slow)
        for f, m in DIST_CASES
    ],
)
def test_shipped_distributed_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family, method):
    spec = assets.FAMILIES[family]
    data = family_assets(family)
    kind = method
    if kind in DIST_POST_TRAINING:  # a DPO or KD config: the recipe, and the model's own method
        config = _copy_config(assets.DIST_POST_TRAINING_CONFIGS[family][kind], tmp_path)
        recipe, method = DIST_POST_TRAINING[kind]
    else:
        config = _copy_config(spec.distributed[method], tmp_path)
        recipe = DIST_RECIPES[method]
    lora = _lora_node(config) if method != "full" else None
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter") if lora else None

    out = tmp_path / "run"
    run_distributed(recipe, config, _dist_overrides(family, kind, method, data, out, adapter, config), cwd=tmp_path)
    uninterrupted = _losses(out)
    assert sorted(uninterrupted) == list(range(1, NUM_STEPS + 1))
    final = out / f"step_{NUM_STEPS}"
    trained = _load_strict(final)
    if lora is not None:
        _check_peft(family, method, data, final, lora)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    overrides = _dist_overrides(family, kind, method, data, resumed_out, adapter, config)
    run_distributed(recipe, config, [*overrides, "resume_from_checkpoint=True"], cwd=tmp_path)
    _check_resumed(resumed_out, uninterrupted, trained)


def _dist_overrides(
    family: str, kind: str, method: str, data: Path, out: Path, adapter: Path | None, config: Path
) -> list[str]:
    """The overrides of a distributed case: the module's, and for a DPO or KD config its data and second model.
    The post-training configs accumulate 8 micro-batches: 1 sample per rank keeps 4 steps within the tiny data
    (2 ranks x 8 x 4 = 64 pairs or samples)."""
    overrides = _overrides(family, method, data, out, adapter)
    if kind not in DIST_POST_TRAINING:
        return overrides
    overrides = [o for o in overrides if not o.startswith(("batch_size=", *(("dataset.",) if "dpo" in kind else ())))]
    overrides.append("batch_size=1")
    if kind == "kd":
        model_type = yaml.safe_load(config.read_text())["checkpointer"]["model_type"]
        return [*overrides, *assets.teacher_overrides(family, data / "hf", model_type)]
    overrides += [
        "dataset._component_=tune.datasets.preference_dataset",
        "dataset.source=json",
        f"dataset.data_files={data / 'pairs.json'}",
        "dataset.split=train",
    ]
    if kind == "full_dpo":  # the reference: the same tiny checkpoint
        overrides.append(f"ref_checkpointer.checkpoint_dir={data / 'hf'}")
    return overrides


DPO_RECIPE = "lora_dpo_single_device"
DPO_CASES = sorted(assets.DPO_CONFIGS)


def _dpo_overrides(family: str, method: str, data: Path, out: Path, adapter: Path) -> list[str]:
    """The SFT overrides with the generated preference pairs as the data, and 1 pair per micro-batch: the config's
    accumulation (4 or 8) is kept, so 4 steps read at most 32 of the 64 pairs."""
    overrides = [
        o for o in _overrides(family, method, data, out, adapter) if not o.startswith(("dataset.", "batch_size="))
    ]
    return [
        *overrides,
        "batch_size=1",
        "dataset._component_=tune.datasets.preference_dataset",
        "dataset.source=json",
        f"dataset.data_files={data / 'pairs.json'}",
        "dataset.split=train",
    ]


@pytest.mark.parametrize("family", DPO_CASES)
def test_shipped_dpo_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family):
    """Each family's LoRA DPO config as the SFT ones above: 4 steps on generated preference pairs (the config's
    accumulation, schedule, optimizer, shuffling and seed setting kept), the outputs load in transformers and PEFT,
    and a run resumed from the step-2 checkpoint ends with the uninterrupted run's losses and weights."""
    relative, method = assets.DPO_CONFIGS[family]
    data = family_assets(family)
    config = _copy_config(relative, tmp_path)
    lora = _lora_node(config)
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter")
    out = tmp_path / "run"
    run_recipe(DPO_RECIPE, config, _dpo_overrides(family, method, data, out, adapter), cwd=tmp_path, timeout=300)
    (log,) = (out / "logs").glob("*.jsonl")
    records = [r for r in read_jsonl(log) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, NUM_STEPS + 1))
    for record in records:
        assert all(torch.isfinite(torch.tensor(record[k])) for k in ("loss", "rewards/margins", "logps/chosen"))
    final = out / f"step_{NUM_STEPS}"
    trained = _load_strict(final)
    _check_peft(family, method, data, final, lora)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    overrides = [*_dpo_overrides(family, method, data, resumed_out, adapter), "resume_from_checkpoint=True"]
    run_recipe(DPO_RECIPE, config, overrides, cwd=tmp_path, timeout=300)
    _check_resumed(resumed_out, _losses(out), trained)


def _check_resumed(resumed_out, uninterrupted: dict, trained) -> None:
    """The resumed run logged steps RESUME_FROM+1..NUM_STEPS with the uninterrupted run's losses (same data order,
    optimizer state, LR schedule and RNG) and ends with its weights, loaded strictly by transformers."""
    resumed = _losses(resumed_out)
    assert sorted(resumed) == list(range(RESUME_FROM + 1, NUM_STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), (step, resumed, uninterrupted)
    resumed_model = _load_strict(resumed_out / f"step_{NUM_STEPS}")
    for (name, param), (_, expected) in zip(resumed_model.named_parameters(), trained.named_parameters()):
        torch.testing.assert_close(param, expected, atol=1e-6, rtol=0, msg=name)


def test_the_missing_shipped_configs_are_the_known_ones():
    # llama3_3 ships only its 70B QLoRA single-device config; a new one must join SINGLE_CASES above
    # (torchtune's qwen2 set none for QLoRA; Mistral v0.3 and NeMo ship LoRA and QLoRA only; Qwen3-MoE 30B-A3B
    # does not fit one GPU for a full fine-tune, nor do Llama 4 Scout (109B) and Maverick (400B, distributed only)
    assert MISSING_SINGLE == [
        ("llama3_3", "full"), ("llama3_3", "lora"), ("mistral_v0_3", "full"), ("mistral_nemo", "full"),
        ("qwen2", "qlora"), ("qwen3_moe", "full"), ("llama4", "full"), ("llama4_maverick", "full"),
        ("llama4_maverick", "lora"), ("llama4_maverick", "qlora"),
    ]  # fmt: skip
    for spec in assets.FAMILIES.values():
        for relative in [*spec.configs.values(), *spec.distributed.values()]:
            assert (assets.CONFIGS / relative).is_file(), relative


def test_every_shipped_distributed_post_training_config_is_a_case():
    # a new *_lora_dpo, *_full_dpo or *_KD_lora_distributed config must join DIST_POST_TRAINING_CONFIGS
    patterns = ("*/*_lora_dpo.yaml", "*/*_full_dpo.yaml", "*/*_KD_lora_distributed.yaml")
    shipped = {path.relative_to(assets.CONFIGS).as_posix() for p in patterns for path in assets.CONFIGS.glob(p)}
    listed = {relative for kinds in assets.DIST_POST_TRAINING_CONFIGS.values() for relative in kinds.values()}
    assert shipped == listed


KD_RECIPE = "knowledge_distillation_single_device"
KD_CASES = sorted(assets.KD_CONFIGS)


@pytest.mark.parametrize("family", KD_CASES)
def test_shipped_kd_config_trains_resumes_and_loads_in_hf(family_assets, tmp_path, family):
    """A *_KD_lora_single_device config as the LoRA ones above (train, transformers and PEFT, resume), with the
    tiny checkpoint as the teacher too: the student's random initial adapter makes the KD term non-zero."""
    data = family_assets(family)
    config = _copy_config(assets.KD_CONFIGS[family], tmp_path)
    lora = _lora_node(config)
    adapter = _initial_adapter(family, data / "hf", lora, tmp_path / "initial_adapter")
    model_type = yaml.safe_load(config.read_text())["checkpointer"]["model_type"]
    teacher = assets.teacher_overrides(family, data / "hf", model_type)

    out = tmp_path / "run"
    run_recipe(
        KD_RECIPE, config, [*_overrides(family, "lora", data, out, adapter), *teacher], cwd=tmp_path, timeout=300
    )
    uninterrupted = _losses(out)
    assert sorted(uninterrupted) == list(range(1, NUM_STEPS + 1))
    (log,) = (out / "logs").glob("*.jsonl")
    kd_losses = [r["kd_loss"] for r in read_jsonl(log) if "kd_loss" in r]
    assert all(torch.isfinite(torch.tensor(kd_losses))) and min(kd_losses) > 0, kd_losses
    final = out / f"step_{NUM_STEPS}"
    trained = _load_strict(final)
    _check_peft(family, "lora", data, final, lora)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    overrides = [*_overrides(family, "lora", data, resumed_out, adapter), *teacher, "resume_from_checkpoint=True"]
    run_recipe(KD_RECIPE, config, overrides, cwd=tmp_path, timeout=300)
    _check_resumed(resumed_out, uninterrupted, trained)


def test_phi3_128k_tiny_model_is_transformers_longrope_model(family_assets):
    """The phi3_128k cases train a model whose LongRoPE comes from the tiny config.json's factors (as the shipped
    128k configs read the real one): on rows longer than its original context (the long factors), tune's model with
    the checkpoint's weights gives transformers' logits."""
    from safetensors.torch import load_file

    from tune.models.phi3 import phi3, phi3_hf_to_tune_from_config

    data = family_assets("phi3_128k")
    hf_model = _load_strict(data / "hf")
    model = phi3(**assets.tune_dims("phi3_128k")).eval()
    state = phi3_hf_to_tune_from_config(load_file(data / "hf" / "model.safetensors"), hf_model.config.to_dict())
    model.load_state_dict(state)
    tokens = torch.randint(3, hf_model.config.vocab_size, (2, 3 * assets.TINY_LONG_ROPE_CONTEXT))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(input_ids=tokens).logits, atol=1e-5, rtol=0)
