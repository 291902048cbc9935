"""Qwen2.5-VL's shipped configs (configs/qwen2_5_vl) end to end: train on images, resume, and load the outputs in
transformers and PEFT.

Each case copies a shipped config as ``tune cp`` gives it and changes it only on the command line: the family's
component builder (``qwen2_5_vl`` / ``lora_qwen2_5_vl``) at tiny dimensions (LoRA settings and trainable parts
kept), a tiny Qwen tokenizer with a small pixel budget, a tiny checkpoint, the colour task of demo/vision_data.py
(tests/recipes/_vision_qwen2_5_vl_assets.py), paths, ``device=cpu dtype=fp32 batch_size=2`` and the run length.
The shipped accumulation (8 micro-batches), schedule, optimizer, shuffling and seed setting are kept.

What is checked:

- every config: 4 steps with finite losses, a checkpoint at steps 2 and 4;
- full: ``Qwen2_5_VLForConditionalGeneration.from_pretrained(step_4)`` loads with no missing or unexpected weight,
  and its logits on a batch with images equal tune's model read from the same files; the frozen vision tower is
  bit-identical to the input files, and what trained (language model, merger) moved;
- LoRA and QLoRA: ``PeftModel.from_pretrained(input model, step_4/adapter)`` gives the merged checkpoint's logits
  (QLoRA: over the input with its adapted weights passed through the NF4 round trip). The runs start from a random
  PEFT adapter (``checkpointer.adapter_checkpoint``) so that the adapter moves the logits far beyond the tolerance;
- resume from the step-2 checkpoint: the losses of steps 3 and 4 equal the uninterrupted run's (one full, one LoRA
  config in the default tier);
- 2 gloo ranks of a distributed LoRA config give the losses of one device with the same global batch;
- an adapter on the vision tower's q/k/v (which transformers fuses into ``qkv``) is written for PEFT as one LoRA on
  ``qkv``, and PEFT's model gives the merged checkpoint's logits.
"""

import functools
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.recipes import _vision_qwen2_5_vl_assets as assets
from tests.recipes._family_assets import nf4_round_trip
from tests.recipes.dist_utils import run_concurrently, run_distributed
from tests.recipes.utils import read_jsonl, run_recipe

pytestmark = pytest.mark.integration

NUM_STEPS, RESUME_FROM = 4, 2
TOLERANCE = 1e-4
# config -> (recipe, the model's method)
SINGLE_DEVICE = {
    "qwen2_5_vl/3B_full_single_device": ("full_finetune_single_device", "full"),
    "qwen2_5_vl/3B_lora_single_device": ("lora_finetune_single_device", "lora"),
    "qwen2_5_vl/3B_qlora_single_device": ("lora_finetune_single_device", "qlora"),
    "qwen2_5_vl/7B_lora_single_device": ("lora_finetune_single_device", "lora"),
    "qwen2_5_vl/7B_qlora_single_device": ("lora_finetune_single_device", "qlora"),
}
DISTRIBUTED = {
    "qwen2_5_vl/7B_full": ("full_finetune_distributed", "full"),
    "qwen2_5_vl/7B_lora": ("lora_finetune_distributed", "lora"),
    "qwen2_5_vl/32B_lora": ("lora_finetune_distributed", "lora"),
    "qwen2_5_vl/72B_qlora": ("lora_finetune_distributed", "qlora"),
}
# the shipped configs this file runs (test_every_config.py counts them as run here)
CONFIGS = [*SINGLE_DEVICE, *DISTRIBUTED]
# default tier: a full and a LoRA config, each trained, resumed and loaded in transformers (PEFT); the rest slow
DEFAULT_TIER = {"qwen2_5_vl/3B_full_single_device", "qwen2_5_vl/3B_lora_single_device"}

# Overrides beyond model, tokenizer, pixel budget, checkpoint, data, paths, device, dtype, batch size and run length
# that the shipped configs needed on CPU (each one a finding about them); empty where none was needed.
CPU_OVERRIDES: list[str] = []


@pytest.fixture(scope="session")
def vl_assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen2_5_vl_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    return assets.build(root)


def _copy_config(name: str, destination: Path) -> Path:
    """The shipped config, copied byte for byte (what ``tune cp`` writes)."""
    path = destination / f"{Path(name).name}.yaml"
    shutil.copyfile(assets.CONFIGS / f"{name}.yaml", path)
    return path


def _overrides(name: str, method: str, root: Path, out: Path, adapter: Path | None) -> list[str]:
    overrides = [
        *assets.tiny_run_overrides(name, method, root, out, NUM_STEPS),
        f"save_every_n_steps={RESUME_FROM}",
        *CPU_OVERRIDES,
    ]
    if adapter is not None:
        overrides.append(f"checkpointer.adapter_checkpoint={adapter}")
    return overrides


def _losses(out: Path) -> dict[int, float]:
    """Step -> training loss, from the run's JSONL log (the shipped configs name it ``log_<unix time>.jsonl``)."""
    (log,) = (out / "logs").glob("*.jsonl")
    return {r["step"]: r["loss"] for r in read_jsonl(log) if "loss" in r}


def _load_hf(directory: Path):
    """``Qwen2_5_VLForConditionalGeneration.from_pretrained`` asserting every weight was found and used."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not problems, f"{directory}: {problems}"
    return model.eval()


@functools.cache
def _probe_batch(root: Path) -> dict:
    """Three rows of the colour task (each with its picture), as the recipes collate them."""
    from tune.data import padded_collate_images
    from tune.datasets.multimodal import the_cauldron_dataset
    from tune.models.qwen2_5_vl import qwen2_5_vl_transform

    transform = qwen2_5_vl_transform(str(assets.tokenizer_file()), max_pixels=assets.MAX_PIXELS)
    dataset = the_cauldron_dataset(
        transform, subset=None, source="json", data_files=str(root / "train.json"), split="train"
    )
    batch = padded_collate_images([dataset[i] for i in range(3)], padding_idx=transform.pad_id)
    batch["real"] = batch["tokens"] != transform.pad_id
    assert batch["encoder_input"]["image_grid_thw"].tolist() == [[1, 6, 6]] * 3  # 9 image tokens a picture
    return batch


def _hf_logits(model, batch: dict) -> torch.Tensor:
    tokens = batch["tokens"]
    image = (tokens == assets.special_ids()["<|image_pad|>"]).int()
    with torch.no_grad():
        return model(
            input_ids=tokens, attention_mask=batch["real"].long(), mm_token_type_ids=image, **batch["encoder_input"]
        ).logits


def _tune_model(directory: Path):
    """tune's Qwen2.5-VL with the weights of an HF checkpoint directory, read through the family's converter."""
    import json

    from tune.models.qwen2_5_vl import qwen2_5_vl_from_hf_config, qwen2_5_vl_hf_to_tune

    config = json.loads((directory / "config.json").read_text())
    model = qwen2_5_vl_from_hf_config(config).eval()
    model.load_state_dict(qwen2_5_vl_hf_to_tune(load_file(directory / "model.safetensors"), config), strict=True)
    return model


def _initial_adapter(base_dir: Path, lora: dict, where: Path) -> Path:
    """A PEFT adapter with random A and B on the modules the config adapts (the language model's projections and
    the merger's two layers), so that the adapter changes the model from the first step."""
    from peft import LoraConfig, get_peft_model

    names = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
    suffixes = [f"self_attn.{names[m]}" for m in lora["lora_attn_modules"]]
    if lora["apply_lora_to_mlp"]:
        suffixes += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    pattern = rf"model\.language_model\.layers\.\d+\.({'|'.join(s.replace('.', r'.') for s in suffixes)})"
    if lora["fusion_trainable"] == "lora":
        pattern = rf"({pattern}|model\.visual\.merger\.mlp\.[02])"
    config = LoraConfig(
        r=lora["lora_rank"],
        lora_alpha=lora["lora_alpha"],
        lora_dropout=0.0,
        target_modules=pattern,
        init_lora_weights=False,
    )
    torch.manual_seed(1)
    peft_model = get_peft_model(_load_hf(base_dir), config)
    with torch.no_grad():  # PEFT's random B is as large as A; smaller keeps the tiny model's losses sane
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.1)
    peft_model.save_pretrained(where)
    return where


def _check_full(root: Path, base_dir: Path, step_dir: Path) -> None:
    """transformers loads the output; its logits equal tune's model's from the same files; the frozen vision tower
    is the input's, bit for bit, and the trained parts moved."""
    batch = _probe_batch(root)
    hf_logits = _hf_logits(_load_hf(step_dir), batch)
    with torch.no_grad():
        tune_logits = _tune_model(step_dir)(batch["tokens"], encoder_input=batch["encoder_input"])
    real = batch["real"]
    assert hf_logits[real].abs().max() > 1.0
    error = (hf_logits[real] - tune_logits[real]).abs().max().item()
    print(f"qwen2.5-vl full output: transformers vs tune logits, max abs difference {error:.3e}")
    assert error <= TOLERANCE
    before, after = load_file(base_dir / "model.safetensors"), load_file(step_dir / "model.safetensors")
    assert before.keys() == after.keys()
    vision = [k for k in before if k.startswith("visual.") and not k.startswith("visual.merger.")]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)
    for trained in ("visual.merger.mlp.0.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert not torch.equal(before[trained], after[trained]), trained


def _check_peft(root: Path, base_dir: Path, step_dir: Path, method: str, vision_lora: bool = False) -> None:
    """PEFT's model over the input (QLoRA: its adapted weights through the NF4 round trip) gives the merged
    checkpoint's logits; the vision tower of the merged checkpoint is the input's unless it had adapters."""
    import json

    from peft import PeftModel

    batch, real = _probe_batch(root), _probe_batch(root)["real"]
    merged = _hf_logits(_load_hf(step_dir), batch)
    base = _load_hf(base_dir)
    targets = json.loads((step_dir / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert any(".blocks." in t for t in targets) == vision_lora, targets
    if method == "qlora":  # the base QLoRA trained on
        with torch.no_grad():
            for name in targets:
                weight = base.get_submodule(name).weight
                weight.copy_(nf4_round_trip(weight))
    base_logits = _hf_logits(base, batch)
    peft_logits = _hf_logits(PeftModel.from_pretrained(base, step_dir / "adapter").eval(), batch)
    error = (peft_logits[real] - merged[real]).abs().max().item()
    moved = (peft_logits[real] - base_logits[real]).abs().max().item()
    print(f"qwen2.5-vl {method} output: PEFT vs merged logits {error:.3e} (the adapter moves them by {moved:.3e})")
    assert error <= TOLERANCE and moved > 1e-2
    before, after = load_file(base_dir / "model.safetensors"), load_file(step_dir / "model.safetensors")
    vision = [k for k in before if k.startswith("visual.blocks.")]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision) != vision_lora


def _crashed_copy(out: Path, where: Path) -> Path:
    """The output directory as a crash after step 2 leaves it: later checkpoints and the log removed."""
    shutil.copytree(out, where)
    shutil.rmtree(where / "logs")
    for later in range(RESUME_FROM + 1, NUM_STEPS + 1):
        for path in (where / f"step_{later}", where / "dcp" / f"step_{later}"):
            if path.exists():
                shutil.rmtree(path)
    return where


def _check_resumed(resumed_out: Path, uninterrupted: dict[int, float]) -> None:
    resumed = _losses(resumed_out)
    assert sorted(resumed) == list(range(RESUME_FROM + 1, NUM_STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), (step, resumed, uninterrupted)


def _train_and_check(name: str, root: Path, tmp_path: Path, resume: bool) -> None:
    distributed = name in DISTRIBUTED
    recipe, method = (DISTRIBUTED if distributed else SINGLE_DEVICE)[name]
    config = _copy_config(name, tmp_path)
    lora = yaml.safe_load(config.read_text())["model"] if method != "full" else None
    base_dir = assets.checkpoint_dir(root, name)
    adapter = _initial_adapter(base_dir, lora, tmp_path / "initial_adapter") if lora else None

    def run(out: Path, *extra: str) -> None:
        overrides = [*_overrides(name, method, root, out, adapter), *extra]
        if distributed:
            run_distributed(recipe, config, overrides, cwd=tmp_path)
        else:
            run_recipe(recipe, config, overrides, cwd=tmp_path, timeout=300)

    out = tmp_path / "run"
    run(out)
    uninterrupted = _losses(out)
    assert sorted(uninterrupted) == list(range(1, NUM_STEPS + 1))
    assert all(torch.isfinite(torch.tensor(list(uninterrupted.values()))))
    print(f"{name}: losses {[round(uninterrupted[s], 4) for s in sorted(uninterrupted)]}")
    final = out / f"step_{NUM_STEPS}"
    assert (final / "model.safetensors").is_file()
    if method == "full":
        _check_full(root, base_dir, final)
    else:
        _check_peft(root, base_dir, final, method)
    if resume:
        resumed_out = _crashed_copy(out, tmp_path / "resumed")
        run(resumed_out, "resume_from_checkpoint=True")
        _check_resumed(resumed_out, uninterrupted)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, id=n.split("/")[1], marks=() if n in DEFAULT_TIER else pytest.mark.slow) for n in SINGLE_DEVICE],
)
def test_shipped_single_device_config_trains_resumes_and_loads_in_hf(vl_assets, tmp_path, name):
    _train_and_check(name, vl_assets, tmp_path, resume=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, id=n.split("/")[1]) for n in DISTRIBUTED])
def test_shipped_distributed_config_trains_resumes_and_loads_in_hf(vl_assets, tmp_path, name):
    _train_and_check(name, vl_assets, tmp_path, resume=name in ("qwen2_5_vl/7B_full", "qwen2_5_vl/7B_lora"))


def test_two_ranks_give_one_devices_losses(vl_assets, tmp_path):
    """7B_lora on 2 gloo ranks of 2 rows each against 7B_lora_single_device with 4-row micro-batches: the same
    global batches (the same seed, so the same shuffled order), the same losses."""
    name, single = "qwen2_5_vl/7B_lora", "qwen2_5_vl/7B_lora_single_device"
    distributed_config, single_config = _copy_config(name, tmp_path), _copy_config(single, tmp_path)
    lora = yaml.safe_load(distributed_config.read_text())["model"]
    adapter = _initial_adapter(assets.checkpoint_dir(vl_assets, name), lora, tmp_path / "initial_adapter")
    two, one = tmp_path / "two_ranks", tmp_path / "one_device"
    two_overrides = [*_overrides(name, "lora", vl_assets, two, adapter), "seed=0"]
    one_overrides = [*_overrides(single, "lora", vl_assets, one, adapter), "seed=0", "batch_size=4"]
    run_concurrently(
        lambda: run_distributed("lora_finetune_distributed", distributed_config, two_overrides, cwd=tmp_path),
        lambda: run_recipe("lora_finetune_single_device", single_config, one_overrides, cwd=tmp_path, timeout=300),
    )
    two_losses, one_losses = _losses(two), _losses(one)
    assert sorted(two_losses) == sorted(one_losses) == list(range(1, NUM_STEPS + 1))
    difference = max(abs(two_losses[s] - one_losses[s]) for s in two_losses)
    print(f"qwen2.5-vl 7B_lora: 2 ranks vs one device, max loss difference {difference:.3e}")
    assert difference <= 1e-5


@pytest.mark.slow
def test_vision_tower_adapter_loads_in_peft(vl_assets, tmp_path):
    """encoder_trainable=lora with q/v adapters on the vision tower: the adapter is written with one LoRA on each
    block's fused qkv, and PEFT's model over the input gives the merged checkpoint's logits."""
    name = "qwen2_5_vl/3B_lora_single_device"
    config = _copy_config(name, tmp_path)
    out = tmp_path / "run"
    # fresh adapters (a starting adapter would lack the tower's), moved by a larger step than the shipped one
    overrides = [*_overrides(name, "lora", vl_assets, out, None), "model.encoder_trainable=lora", "optimizer.lr=0.01"]
    run_recipe("lora_finetune_single_device", config, overrides, cwd=tmp_path, timeout=300)
    _check_peft(vl_assets, assets.checkpoint_dir(vl_assets, name), out / f"step_{NUM_STEPS}", "lora", vision_lora=True)
