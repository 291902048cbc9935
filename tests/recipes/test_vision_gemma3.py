"""Gemma 3 with images through the SFT recipes: every shipped ``configs/gemma3_vision/*.yaml``, end to end.

Each case copies the shipped config byte for byte and changes it only on the command line: the model node pointed at
``gemma3_vision`` / ``lora_gemma3_vision`` with tiny dimensions (the trainable choices and LoRA settings kept), the
tiny tokenizer with its image settings, the tiny checkpoint, the colour task of demo/vision_data.py, paths and
``device=cpu dtype=fp32 batch_size=2 max_steps_per_epoch=4`` (tests/recipes/_vision_gemma3_assets.py). The config's
seed setting, shuffling, accumulation (8), schedule, optimizer and activation checkpointing are kept.

What is checked:

- every config: 4 steps with finite losses, a checkpoint after each, and a run resumed from the step-2 checkpoint
  that logs the uninterrupted run's losses of steps 3 and 4 (within 1e-6) and ends with its weights;
- full: ``transformers.Gemma3ForConditionalGeneration.from_pretrained(step_4)`` loads with no missing, unexpected or
  resized weight, and its logits on a padded batch of images and questions equal those of tune's model built from
  the same files (``tune.models.from_hf``) within 1e-4; the vision tower, frozen by the shipped config, is
  bit-identical to the input files, while the language model and projector moved;
- LoRA and QLoRA: ``PeftModel.from_pretrained(input model, step_4/adapter)`` gives the merged checkpoint's logits
  within 1e-4 (for QLoRA on the input with its adapted weights through the NF4 round trip), adapts the language
  model only, and loads every adapter weight; the vision tower, projector and the language model's unadapted
  weights are bit-identical to the input. The runs start from a random PEFT adapter (``adapter_checkpoint``) so
  that after 4 warm-up steps of the shipped schedule the adapter still moves the logits far beyond the tolerance;
- the distributed configs on 2 gloo ranks train, and their outputs load in transformers (and PEFT); the distributed
  LoRA config's losses equal one device's (its single-device twin, 4 samples per micro-batch) within 1e-5.

Default tier: the 4B full and LoRA single-device configs; the rest is slow (``make test-all``).
"""

import shutil
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.recipes import _vision_gemma3_assets as assets
from tests.recipes.dist_utils import run_concurrently, run_distributed
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

SINGLE_DEVICE = [
    "gemma3_vision/4B_full_single_device",
    "gemma3_vision/4B_lora_single_device",
    "gemma3_vision/4B_qlora_single_device",
    "gemma3_vision/12B_lora_single_device",
    "gemma3_vision/12B_qlora_single_device",
    "gemma3_vision/27B_qlora_single_device",
]
DISTRIBUTED = ["gemma3_vision/12B_full", "gemma3_vision/12B_lora", "gemma3_vision/27B_lora"]
# the shipped configs this file runs (test_every_config.py leaves them to it)
CONFIGS = [*SINGLE_DEVICE, *DISTRIBUTED]
DEFAULT_TIER = {"gemma3_vision/4B_full_single_device", "gemma3_vision/4B_lora_single_device"}

# Overrides beyond dimensions, tokenizer, data, paths, device, dtype, batch size and steps that the shipped configs
# needed on CPU (each one would be a finding about them): none.
CPU_OVERRIDES: list[str] = []

NUM_STEPS, RESUME_FROM = 4, 2
TOLERANCE = 1e-4
# HF module names of the config's lora_attn_modules and apply_lora_to_mlp
HF_ATTN_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
HF_MLP_NAMES = ["gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The tiny assets, built once for the module."""
    directory = tmp_path_factory.mktemp("gemma3_vision_assets")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_CACHE", str(directory / "hf_datasets_cache"))
        yield assets.build_assets(directory)


def _copy_config(name: str, destination: Path) -> Path:
    """The shipped config, copied byte for byte (what ``tune cp`` writes)."""
    path = destination / f"{Path(name).name}.yaml"
    shutil.copyfile(assets.config_path(name), path)
    return path


def _method(config: Path) -> str:
    builder = yaml.safe_load(config.read_text())["model"]["_component_"].rsplit(".", 1)[-1]
    return "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"


def _recipe(name: str, method: str) -> str:
    scale = "single_device" if name.endswith("_single_device") else "distributed"
    return f"{'full' if method == 'full' else 'lora'}_finetune_{scale}"


def _overrides(root: Path, method: str, out: Path, adapter: Path | None) -> list[str]:
    builder = "gemma3_vision" if method == "full" else "lora_gemma3_vision"
    overrides = [
        *assets.run_overrides(root, builder, out, NUM_STEPS, quantize=method == "qlora"),
        "save_every_n_steps=1",
        *CPU_OVERRIDES,
    ]
    return overrides if adapter is None else [*overrides, f"checkpointer.adapter_checkpoint={adapter}"]


def _losses(out: Path) -> dict[int, float]:
    """Step -> training loss, from the run's JSONL log (``log_<unix time>.jsonl``)."""
    (log,) = (out / "logs").glob("*.jsonl")
    return {record["step"]: record["loss"] for record in read_jsonl(log) if "loss" in record}


def _check_trained(out: Path) -> dict[int, float]:
    losses = _losses(out)
    assert sorted(losses) == list(range(1, NUM_STEPS + 1)), losses
    assert all(torch.isfinite(torch.tensor(list(losses.values())))), losses
    for step in range(1, NUM_STEPS + 1):
        assert (out / f"step_{step}" / "model.safetensors").is_file()
    return losses


def _hf_targets(lora: dict) -> list[str]:
    return [HF_ATTN_NAMES[name] for name in lora["lora_attn_modules"]] + (
        HF_MLP_NAMES if lora["apply_lora_to_mlp"] else []
    )


def _initial_adapter(root: Path, lora: dict, where: Path) -> Path:
    """A PEFT adapter on the language model of the input checkpoint, for the config's LoRA settings, with random A
    and B (B scaled down to keep the tiny model's losses sane)."""
    from peft import LoraConfig, get_peft_model

    targets = "|".join(_hf_targets(lora))
    config = LoraConfig(
        r=lora["lora_rank"],
        lora_alpha=lora["lora_alpha"],
        lora_dropout=0.0,
        target_modules=rf".*language_model\..*\.({targets})",
        init_lora_weights=False,
    )
    torch.manual_seed(1)
    model = get_peft_model(_load_hf(root / "hf"), config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.1)
    model.save_pretrained(where)
    return where


def _load_hf(directory: Path):
    """``Gemma3ForConditionalGeneration.from_pretrained`` asserting that every weight was found and used as saved."""
    from transformers import Gemma3ForConditionalGeneration

    model, info = Gemma3ForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"{directory}: {problems}"
    return model.eval()


def _hf_logits(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(
            input_ids=batch["tokens"],
            pixel_values=batch["encoder_input"]["images"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
        ).logits


def _tune_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under tune's keys (layout-independent: transformers 5 writes the vision tower without
    ``vision_model.``, tune writes the releases' layout)."""
    from safetensors.torch import load_file

    from tune.models.gemma3_vision import gemma3_vision_hf_to_tune

    config = yaml.safe_load((directory / "config.json").read_text())
    return gemma3_vision_hf_to_tune(load_file(directory / "model.safetensors"), config)


def _unchanged(before: dict, after: dict, prefixes: tuple[str, ...]) -> list[str]:
    """The keys under ``prefixes``, asserting each is bit-identical in ``after``."""
    keys = [key for key in before if key.startswith(prefixes)]
    assert keys and sorted(keys) == sorted(key for key in after if key.startswith(prefixes))
    changed = [key for key in keys if not torch.equal(before[key], after[key])]
    assert not changed, f"weights that should not have trained changed: {changed}"
    return keys


def _check_full(root: Path, step_dir: Path, config: Path) -> None:
    from tune.models import from_hf

    batch = assets.image_batch(root)
    real = batch["attention_mask"].bool()
    expected = _hf_logits(_load_hf(step_dir), batch)
    model = from_hf(step_dir)
    with torch.no_grad():
        actual = model(batch["tokens"], encoder_input=batch["encoder_input"])
    assert expected[real].abs().max() > 1.0  # not a comparison of near-zero logits
    error = (expected[real] - actual[real]).abs().max().item()
    print(f"gemma3 vision full: transformers vs tune logits on the trained files, max abs error {error:.3e}")
    assert error <= TOLERANCE

    node = yaml.safe_load(config.read_text())["model"]
    assert (node["decoder_trainable"], node["encoder_trainable"], node["fusion_trainable"]) == (True, False, True)
    before, after = _tune_weights(root / "hf"), _tune_weights(step_dir)
    _unchanged(before, after, ("encoder.",))
    for part in ("decoder.", "projector."):  # the trained parts moved
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(part)), part


def _check_peft(root: Path, step_dir: Path, lora: dict, method: str) -> None:
    from peft import PeftModel

    from tests.recipes._family_assets import nf4_round_trip

    batch = assets.image_batch(root)
    real = batch["attention_mask"].bool()
    merged_logits = _hf_logits(_load_hf(step_dir), batch)
    base = _load_hf(root / "hf")
    targets = set(_hf_targets(lora))
    if method == "qlora":  # QLoRA trains on the NF4 round trip of the adapted weights, and merges into it
        with torch.no_grad():
            for name, module in base.named_modules():
                if "language_model" in name and name.rsplit(".", 1)[-1] in targets:
                    module.weight.copy_(nf4_round_trip(module.weight))
    base_logits = _hf_logits(base, batch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapted = PeftModel.from_pretrained(base, step_dir / "adapter").eval()
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    assert not missing, missing  # PEFT found a weight for every LoRA layer it made
    lora_layers = [name for name, module in adapted.named_modules() if hasattr(module, "lora_A")]
    assert lora_layers and all(".language_model." in name for name in lora_layers), lora_layers
    peft_logits = _hf_logits(adapted, batch)
    error = (peft_logits[real] - merged_logits[real]).abs().max().item()
    moved = (peft_logits[real] - base_logits[real]).abs().max().item()
    print(f"gemma3 vision {method}: PEFT vs merged logits, max abs error {error:.3e}; adapter moves them {moved:.3f}")
    assert error <= TOLERANCE
    assert moved > 1e-2  # the comparison means something only where the adapter matters

    before, after = _tune_weights(root / "hf"), _tune_weights(step_dir)
    _unchanged(before, after, ("encoder.", "projector.", "decoder.tok_embeddings.", "decoder.layers.0.attn.k_proj."))


def _crashed_copy(out: Path, where: Path) -> Path:
    """The output directory as a crash after step 2 leaves it: later checkpoints (and ``dcp/step_N``) and the log
    removed."""
    shutil.copytree(out, where)
    shutil.rmtree(where / "logs")
    for later in range(RESUME_FROM + 1, NUM_STEPS + 1):
        for path in (where / f"step_{later}", where / "dcp" / f"step_{later}"):
            if path.exists():
                shutil.rmtree(path)
    return where


def _check_resumed(resumed_out: Path, uninterrupted: dict[int, float], out: Path) -> None:
    resumed = _losses(resumed_out)
    assert sorted(resumed) == list(range(RESUME_FROM + 1, NUM_STEPS + 1)), resumed
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), (step, resumed, uninterrupted)
    print(f"gemma3 vision resume: losses {resumed} vs uninterrupted {uninterrupted}")
    final, expected = _tune_weights(resumed_out / f"step_{NUM_STEPS}"), _tune_weights(out / f"step_{NUM_STEPS}")
    assert sorted(final) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(final[key], value, atol=1e-6, rtol=0, msg=key)


def _lora_node(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["model"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n, marks=() if n in DEFAULT_TIER else pytest.mark.slow) for n in SINGLE_DEVICE]
)
def test_single_device_config_trains_resumes_and_loads_in_hf(root, tmp_path, name):
    config = _copy_config(name, tmp_path)
    method = _method(config)
    recipe = _recipe(name, method)
    lora = _lora_node(config) if method != "full" else None
    adapter = _initial_adapter(root, lora, tmp_path / "initial_adapter") if lora else None

    out = tmp_path / "run"
    run_recipe(recipe, config, _overrides(root, method, out, adapter), cwd=tmp_path, timeout=300)
    uninterrupted = _check_trained(out)
    final = out / f"step_{NUM_STEPS}"
    if method == "full":
        _check_full(root, final, config)
    else:
        _check_peft(root, final, lora, method)

    resumed_out = _crashed_copy(out, tmp_path / "resumed")
    overrides = [*_overrides(root, method, resumed_out, adapter), "resume_from_checkpoint=True"]
    run_recipe(recipe, config, overrides, cwd=tmp_path, timeout=300)
    _check_resumed(resumed_out, uninterrupted, out)


# the keys the distributed recipes add to their single-device twins
_DISTRIBUTED_KEYS = ("tensor_parallel_dim", "fsdp_cpu_offload", "fsdp_reshard_after_forward", "dist_backend")


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTED)
def test_distributed_config_trains_on_two_ranks_and_loads_in_hf(root, tmp_path, name):
    config = _copy_config(name, tmp_path)
    method = _method(config)
    lora = _lora_node(config) if method != "full" else None
    adapter = _initial_adapter(root, lora, tmp_path / "initial_adapter") if lora else None
    out = tmp_path / "run"
    run_distributed(_recipe(name, method), config, _overrides(root, method, out, adapter), cwd=tmp_path)
    _check_trained(out)
    final = out / f"step_{NUM_STEPS}"
    if method == "full":
        _check_full(root, final, config)
    else:
        _check_peft(root, final, lora, method)


@pytest.mark.slow
def test_two_ranks_equal_one_device(root, tmp_path):
    """The distributed LoRA config on 2 ranks x 2 samples and its single-device twin on 4 samples per micro-batch
    (the same global batch: each rank reads every second index of the one shuffled order) log the same losses. Both
    runs get one seed (the shipped ``seed: null`` draws one per run, and so a different shuffle)."""
    distributed = _copy_config("gemma3_vision/12B_lora", tmp_path)
    single = _copy_config("gemma3_vision/12B_lora_single_device", tmp_path)
    shipped = [yaml.safe_load(path.read_text()) for path in (distributed, single)]
    for key in ("output_dir", "optimizer_in_bwd", *_DISTRIBUTED_KEYS):
        for cfg in shipped:
            cfg.pop(key, None)
    assert shipped[0] == shipped[1]  # the twin differs in nothing that trains
    adapter = _initial_adapter(root, _lora_node(distributed), tmp_path / "initial_adapter")
    out_distributed, out_single = tmp_path / "distributed", tmp_path / "single"
    common = ["seed=7"]
    single_overrides = [*_overrides(root, "lora", out_single, adapter), *common, "batch_size=4"]
    run_concurrently(
        lambda: run_distributed(
            "lora_finetune_distributed",
            distributed,
            [*_overrides(root, "lora", out_distributed, adapter), *common],
            cwd=tmp_path,
        ),
        lambda: run_recipe("lora_finetune_single_device", single, single_overrides, cwd=tmp_path, timeout=300),
    )
    two_ranks, one_device = _check_trained(out_distributed), _check_trained(out_single)
    difference = max(abs(two_ranks[step] - one_device[step]) for step in one_device)
    print(f"gemma3 vision LoRA: 2 ranks {two_ranks} vs 1 device {one_device}, max difference {difference:.2e}")
    assert difference <= 1e-5


def test_every_shipped_gemma3_vision_training_config_is_run_here():
    # the generation config (4B_generation) is run by tests/recipes/test_generate_vision.py
    shipped = [path.stem for path in (assets.CONFIGS_DIR / "gemma3_vision").glob("*.yaml")]
    assert sorted(f"gemma3_vision/{stem}" for stem in shipped if "generation" not in stem) == sorted(CONFIGS)
