"""Mixture-of-experts models in the distributed SFT recipes, on CPU with gloo: the tiny Qwen3-MoE of
tests/recipes/_family_assets.py (2 layers, 8 experts, 2 per token) trained on 2 ranks, with FSDP2 sharding the
stacked experts along dim 0 (the default) and with expert parallelism (``expert_parallel_dim=2``: 4 whole experts
per rank, tokens exchanged by all-to-all), against the single-device recipe on the same 4 samples per step.

2 ranks x batch 1 x 2 accumulation steps see the same 4 micro-batches per step as 1 device x batch 1 x 4
accumulation steps (the sampler deals samples round-robin), so the losses agree to float32 rounding (1e-5).
The Hugging Face checkpoints are compared through transformers' ``Qwen3MoeForCausalLM``.
"""

import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.recipes import _family_assets as assets
from tests.recipes.dist_utils import max_difference, run_concurrently, run_distributed, train_log
from tests.recipes.test_moe_recipes import write_config
from tests.recipes.utils import run_recipe

pytestmark = pytest.mark.integration

STEPS = 3
SINGLE = {"batch_size": 1, "gradient_accumulation_steps": 4, "max_steps_per_epoch": STEPS}
TWO_RANKS = {"batch_size": 1, "gradient_accumulation_steps": 2, "max_steps_per_epoch": STEPS}
LORA_EXPERTS = {"apply_lora_to_experts": True}  # the experts' adapters are split with their experts


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory):
    """The tiny Qwen3-MoE checkpoint (``hf/``) and ``train.json``."""
    root = tmp_path_factory.mktemp("moe_dist_assets")
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf_datasets_cache")
    return assets.build_family_assets("qwen3_moe", root / "qwen3_moe")


def _hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()


def _max_weight_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _run_single_and_two_ranks(
    moe_assets, tmp_path, method, model_settings, *two_rank_settings, checkpointer_settings=None
):
    """The single-device run and one 2-rank run per entry of ``two_rank_settings``, side by side."""
    single = tmp_path / "single"
    overrides = [f"checkpointer.{key}={value}" for key, value in (checkpointer_settings or {}).items()]
    runs = [
        lambda: run_recipe(
            f"{method}_finetune_single_device",
            write_config(tmp_path / "a", moe_assets, single, method, model_settings, **SINGLE),
            overrides,
            cwd=tmp_path,
            timeout=300,
        )
    ]
    outs, recipe = [], f"{method}_finetune_distributed"
    for i, settings in enumerate(two_rank_settings):
        out = tmp_path / f"two_{i}"
        config = write_config(tmp_path / f"b{i}", moe_assets, out, method, model_settings, **TWO_RANKS, **settings)
        runs.append(lambda config=config: run_distributed(recipe, config, overrides, cwd=tmp_path))
        outs.append(out)
    run_concurrently(*runs)
    return single, outs


@pytest.mark.slow
def test_expert_parallel_full_finetune_matches_one_device_and_saves_the_same_checkpoint(moe_assets, tmp_path):
    # FSDP2 alone (experts sharded along dim 0: 4 of the 8 per rank, gathered for each forward) and expert
    # parallelism (4 whole experts per rank, never gathered), both against one device
    single, (fsdp, ep) = _run_single_and_two_ranks(
        moe_assets,
        tmp_path,
        "full",
        None,
        {},
        # activation checkpointing: the recomputed forward passes exchange the tokens again, in backward
        {"expert_parallel_dim": 2, "save_every_n_steps": 1, "enable_activation_checkpointing": True},
    )
    ref = train_log(single)
    for name, out in (("fsdp", fsdp), ("expert parallel", ep)):
        got = train_log(out)
        diff = max_difference(ref, got, "loss")
        print(f"{name}: max |loss(2 ranks) - loss(1 device)| = {diff:.2e}")
        assert diff < 1e-5
        assert max_difference(ref, got, "grad_norm") < 1e-4 * ref[1]["grad_norm"]

    # the gathered checkpoint holds all 8 experts, as one device's does, with the same trained values
    reference_weights = _hf_weights(single / f"step_{STEPS}")
    weight_diff = _max_weight_difference(_hf_weights(ep / f"step_{STEPS}"), reference_weights)
    print(f"expert parallel: max |weight - one device's| in the saved checkpoint = {weight_diff:.2e}")
    assert weight_diff < 1e-5
    start = _hf_weights(moe_assets / "hf")
    expert = "model.layers.0.mlp.experts.gate_up_proj"
    assert expert in reference_weights and (reference_weights[expert] - start[expert]).abs().max() > 1e-4

    # resume: "crash" after step 1, continue from its sharded state (the experts of each rank) with the same losses
    uninterrupted = train_log(ep)
    for path in [ep / "step_2", ep / "step_3", ep / "dcp" / "step_2", ep / "logs"]:
        shutil.rmtree(path)
    config = write_config(
        tmp_path / "resume",
        moe_assets,
        ep,
        **TWO_RANKS,
        expert_parallel_dim=2,
        save_every_n_steps=1,
        resume_from_checkpoint=True,
    )
    run_distributed("full_finetune_distributed", config, [], cwd=tmp_path)
    resumed = train_log(ep)
    assert sorted(resumed) == [2, 3]
    for step in resumed:
        assert resumed[step]["loss"] == pytest.approx(uninterrupted[step]["loss"], abs=1e-6, rel=0), step
    assert _max_weight_difference(_hf_weights(ep / f"step_{STEPS}"), reference_weights) < 1e-5


def _random_adapter(where: Path) -> Path:
    """A starting adapter for both recipes, in tune's keys, with random A and B (LoRA on q_proj, v_proj and the
    experts, as write_config's LoRA model): each recipe would draw its own fresh adapters from a different random
    stream (one device initialises the whole model, the distributed recipe only the adapters), and a non-zero B
    makes the first loss depend on it."""
    from safetensors.torch import save_file

    from tune.models.qwen3_moe import lora_qwen3_moe
    from tune.modules.peft import get_adapter_params

    torch.manual_seed(0)
    dims = {**assets.tune_dims("qwen3_moe"), "mlp_only_layers": []}
    model = lora_qwen3_moe(["q_proj", "v_proj"], lora_rank=4, lora_alpha=8.0, **LORA_EXPERTS, **dims)
    adapter = {name: torch.randn_like(param) * 0.05 for name, param in get_adapter_params(model).items()}
    assert any(name.endswith("gate_proj_lora_b") for name in adapter)
    where.mkdir(parents=True)
    save_file(adapter, str(where / "adapter_model.safetensors"))
    return where


@pytest.mark.slow
def test_expert_parallel_lora_on_experts_matches_one_device(moe_assets, tmp_path):
    start = {"adapter_checkpoint": str(_random_adapter(tmp_path / "start_adapter"))}
    single, (fsdp, ep) = _run_single_and_two_ranks(
        moe_assets, tmp_path, "lora", LORA_EXPERTS, {}, {"expert_parallel_dim": 2}, checkpointer_settings=start
    )
    ref = train_log(single)
    for name, out in (("fsdp", fsdp), ("expert parallel", ep)):
        diff = max_difference(ref, train_log(out), "loss")
        print(f"lora, {name}: max |loss(2 ranks) - loss(1 device)| = {diff:.2e}")
        assert diff < 1e-5
    # the merged checkpoint: base experts plus their trained adapters, all 8 experts gathered
    weight_diff = _max_weight_difference(_hf_weights(ep / f"step_{STEPS}"), _hf_weights(single / f"step_{STEPS}"))
    print(f"lora, expert parallel: max |merged weight - one device's| = {weight_diff:.2e}")
    assert weight_diff < 1e-5


@pytest.mark.parametrize(
    "recipe, value, expected",
    [
        # without torchrun the recipe runs as a world of 1 process, which 2 cannot divide
        ("full_finetune_distributed", 2, "expert_parallel_dim=2 does not divide the world size 1"),
        ("full_finetune_distributed", 0, "must be a positive integer (1: no expert parallelism)"),
        ("full_finetune_single_device", 2, "a single-device recipe holds every expert on its one device"),
    ],
)
def test_a_bad_expert_parallel_dim_is_a_config_error(tmp_path, recipe, value, expected):
    # reported before anything is read: the checkpoint and data paths need not exist
    config = write_config(tmp_path, tmp_path / "no_assets", tmp_path / "run", expert_parallel_dim=value)
    proc = run_recipe(recipe, config, [], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "expert_parallel_dim" in proc.stderr and expected in proc.stderr
