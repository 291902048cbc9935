"""Integration tests of context parallelism (``context_parallel_dim``) in the SFT distributed recipes:
`tune run --nproc_per_node N` (torchrun) on CPU with gloo, on the tiny Llama of tests/recipes/utils.py (and the tiny
Qwen2.5 and Qwen3 of tests/recipes/_family_assets.py).

The reference is the same recipe run without torchrun (a world of 1 process) on the same global batch. The ranks of
a ``cp`` group read the same batch and each keeps 2 of the 2N chunks of every sequence, attending them to the whole
sequence's gathered keys and values, and the loss is summed over the group: only the order of float sums changes,
so the per-token mean loss and the gradient norm must agree to float32 rounding (1e-5 relative asked, 1e-7 to 1e-6
measured; a loss or gradient counted twice, or a chunk missed, is off by far more). The data covers both attention
paths: padded rows (causal, no mask) whose length is not a multiple of 2N, so the recipe pads every sequence, and
padding-free rows or packs (a block-causal mask) whose documents cross the ranks' chunk boundaries. The 2 dp x 2 cp
run reads 2 samples per data-parallel shard: the same 4 per step as one device. Checkpoints written under context
parallelism load without it (transformers, PEFT), and a cp run resumes exactly.
"""

import shutil
from pathlib import Path

import pytest
import torch

from tests._helpers import assert_close_after_adamw
from tests.recipes import _family_assets as family
from tests.recipes.dist_utils import VAL, run_concurrently, run_distributed, train_log, validation_logits
from tests.recipes.utils import ASSETS, random_peft_adapter, run_recipe

pytestmark = pytest.mark.integration

FULL, LORA = "full_finetune_distributed", "lora_finetune_distributed"
FULL_CONFIG, LORA_CONFIG = ASSETS / "full_tiny.yaml", ASSETS / "lora_tiny.yaml"
STEPS = 3
TOLERANCE = 1e-5  # relative, on the per-token mean loss and the gradient norm
# Padded rows in dataset order: the tiny samples are 182-256 tokens and every batch of 4 (or 2) holds one longer
# than 255, so truncated at 255 each batch is 255 long: not a multiple of 4 or 8, the recipe pads for 2 or 4 ranks.
PADDED = ["collate_fn=tune.data.padded_collate_sft", "tokenizer.max_seq_len=255"]
# Padding-free rows: 2 whole samples per row (<= 512 tokens, the model's max_seq_len; more and the collate pads), a
# block-causal mask whose document boundary falls inside a rank's chunk.
PADDING_FREE = ["collate_fn=tune.data.padding_free_collate"]
# dataset.packed: the instructions as plain text packed into rows of 253 tokens, a text going on in the next pack:
# several documents per pack, 2 packs per padding-free row (506 tokens, not a multiple of 4).
PACKED = [
    "dataset._component_=tune.datasets.text_completion_dataset",
    "~dataset.train_on_input",
    "dataset.column=instruction",
    "dataset.packed=True",
    "tokenizer.max_seq_len=253",
    "collate_fn=tune.data.padding_free_collate",
]


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", f"max_steps_per_epoch={STEPS}", *extra]


def _compare(reference: dict, got: dict, label: str, keys=("loss", "grad_norm")) -> dict[str, float]:
    """The largest difference of each metric over the steps, relative to the reference's value; printed."""
    assert sorted(got) == sorted(reference) and len(reference) >= 2, (sorted(reference), sorted(got))
    worst = {k: max(abs(got[s][k] - reference[s][k]) / abs(reference[s][k]) for s in reference) for k in keys}
    print(f"{label}: max |cp - 1 device| / |1 device| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    return worst


def first_batches(config: Path, overrides: list[str], batch_size: int, num_batches: int) -> list:
    """The first batches the recipe reads in dataset order (no shuffle), built in this process from the config."""
    from tune import config as tune_config

    cfg = tune_config.load_config(config, overrides)
    tokenizer = tune_config.instantiate(cfg.tokenizer)
    dataset = tune_config.instantiate(cfg.dataset, tokenizer)
    collate = tune_config.instantiate_collate(
        cfg.collate_fn, dataset, padding_idx=tokenizer.pad_id, ignore_idx=-100, max_seq_len=cfg.model.max_seq_len
    )
    return [collate([dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)]) for b in range(num_batches)]


def _assert_documents_cross_chunks(batches: list[dict], num_chunks: int) -> None:
    """Padding-free rows: one row, a block-causal mask, and a document starting inside a chunk of the 2N."""
    crossing = False
    for batch in batches:
        assert batch["tokens"].shape[0] == 1 and batch["mask"].dim() == 3, batch["tokens"].shape
        length = batch["tokens"].shape[1]
        chunk = -(-length // num_chunks)  # the recipe pads the row to a multiple of num_chunks
        starts = (batch["input_pos"][0] == 0).nonzero().flatten().tolist()
        assert len(starts) >= 2, starts  # several documents in the row
        crossing |= any(start % chunk for start in starts[1:])
    assert crossing


def _two_rank_run(recipe: str, config: Path, overrides: list[str], cwd: Path, cp_extra: list[str] = ()):
    """The recipe on one process (``cwd/one``) and with context_parallel_dim=2 on 2 ranks (``cwd/cp2``), side by
    side; the cp run's process."""
    _, proc = run_concurrently(
        lambda: run_recipe(recipe, config, [*overrides, f"output_dir={cwd / 'one'}"], cwd),
        lambda: run_distributed(
            recipe, config, [*overrides, f"output_dir={cwd / 'cp2'}", "context_parallel_dim=2", *cp_extra], cwd
        ),
    )
    assert "1 data-parallel shard(s) x 2 context-parallel" in proc.stderr  # the layout the run logged
    return proc


@pytest.mark.parametrize(
    "data, extra, cp_extra",
    [
        # the causal path without a mask, padded to 256; activation checkpointing recomputes the gathers; the
        # validation loss after the last step (4 + 4 + 2 samples of val.json)
        pytest.param(
            PADDED,
            ["batch_size=4", *VAL, f"run_val_every_n_steps={STEPS}"],
            ["enable_activation_checkpointing=True"],
            id="padded",
        ),
        # the masked path; 2 micro-batches of 2 samples per step (the loss tokens of both count); gradients
        # clipped (norms ~3) over the dp_shard x cp mesh
        pytest.param(
            PADDING_FREE,
            ["batch_size=2", "gradient_accumulation_steps=2", "clip_grad_norm=1.0"],
            [],
            id="padding_free",
        ),
        pytest.param(PACKED, ["batch_size=2"], [], id="packed"),
    ],
)
def test_two_cp_ranks_match_one_device(tiny_assets, tmp_path, data, extra, cp_extra):
    overrides = [f"assets_dir={tiny_assets}", f"max_steps_per_epoch={STEPS}", *data, *extra]
    batch_size = int(extra[0].split("=")[1])
    accumulation = 2 if "gradient_accumulation_steps=2" in extra else 1  # every micro-batch the steps read
    batches = first_batches(FULL_CONFIG, overrides, batch_size, STEPS * accumulation)
    if data is PADDED:
        assert all(b["tokens"].shape[1] % 4 for b in batches), [b["tokens"].shape for b in batches]
    else:
        _assert_documents_cross_chunks(batches, num_chunks=4)
        assert any(b["tokens"].shape[1] % 4 for b in batches)  # the padding path too
    _two_rank_run(FULL, FULL_CONFIG, overrides, tmp_path, cp_extra)
    label = f"full, {'packed' if data is PACKED else 'padding-free' if data is PADDING_FREE else 'padded'}, cp=2"
    reference, got = train_log(tmp_path / "one"), train_log(tmp_path / "cp2")
    worst = _compare(reference, got, label)
    assert worst["loss"] < TOLERANCE and worst["grad_norm"] < TOLERANCE, worst
    if "val_loss" in reference[STEPS]:
        val_diff = abs(got[STEPS]["val_loss"] / reference[STEPS]["val_loss"] - 1)
        print(f"{label}: |val_loss(cp) / val_loss(1 device) - 1| = {val_diff:.1e}")
        assert val_diff < TOLERANCE


def test_four_ranks_cp4_and_two_dp_shards_of_cp2_match_one_device(tiny_assets, tmp_path):
    """cp=4 (one data-parallel shard, 8 chunks of 32 tokens) and 2 dp x 2 cp (2 samples per shard) on padded rows
    of 255 tokens, each against one device reading the same 4 samples per step."""
    common = [f"assets_dir={tiny_assets}", f"max_steps_per_epoch={STEPS}", *PADDED]
    assert all(b["tokens"].shape[1] % 8 for b in first_batches(FULL_CONFIG, [*common, "batch_size=4"], 4, STEPS))
    one, cp4, dp2cp2 = tmp_path / "one", tmp_path / "cp4", tmp_path / "dp2_cp2"
    run_recipe(FULL, FULL_CONFIG, [*common, "batch_size=4", f"output_dir={one}"], tmp_path)
    proc = run_distributed(
        FULL, FULL_CONFIG, [*common, "batch_size=4", f"output_dir={cp4}", "context_parallel_dim=4"], tmp_path, nproc=4
    )
    assert "1 data-parallel shard(s) x 4 context-parallel" in proc.stderr
    proc = run_distributed(
        FULL, FULL_CONFIG, [*common, "batch_size=2", f"output_dir={dp2cp2}", "context_parallel_dim=2"], tmp_path, 4
    )
    assert "2 data-parallel shard(s) x 2 context-parallel" in proc.stderr
    reference = train_log(one)
    worst_cp4 = _compare(reference, train_log(cp4), "full, cp=4 on 4 ranks")
    worst_dp2cp2 = _compare(reference, train_log(dp2cp2), "full, 2 dp x 2 cp on 4 ranks")
    assert max(worst_cp4.values()) < TOLERANCE and max(worst_dp2cp2.values()) < TOLERANCE, (worst_cp4, worst_dp2cp2)


def test_resume_with_cp_and_its_checkpoint_loads_without_it(tiny_assets, tmp_path):
    """A cp=2 run resumed after step 2 reproduces the uninterrupted one (shuffled data, a cosine schedule); its HF
    checkpoint loads in transformers and gives the one-device run's logits."""
    steps = 4
    common = [
        f"assets_dir={tiny_assets}",
        f"max_steps_per_epoch={steps}",
        *PADDED,
        "batch_size=4",
        "shuffle=True",
        "save_every_n_steps=2",
        "lr_scheduler._component_=tune.training.get_cosine_schedule_with_warmup",
        "lr_scheduler.num_warmup_steps=1",
    ]
    one, out = tmp_path / "one", tmp_path / "cp2"
    _two_rank_run(FULL, FULL_CONFIG, common, tmp_path)
    uninterrupted = train_log(out)
    worst = _compare(train_log(one), uninterrupted, f"full, {steps} shuffled steps, cp=2")
    assert max(worst.values()) < TOLERANCE, worst
    final = out / f"step_{steps}"
    from transformers import LlamaForCausalLM

    trained = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32)
    reference = LlamaForCausalLM.from_pretrained(one / f"step_{steps}", dtype=torch.float32)
    cp_logits, ref_logits = validation_logits(trained, tiny_assets), validation_logits(reference, tiny_assets)
    logits_diff = (cp_logits - ref_logits).abs().max().item()
    print(f"full cp=2: max |logits(cp=2 checkpoint) - logits(1 device)| after {steps} steps = {logits_diff:.2e}")
    assert logits_diff < 1e-4

    # "crash" after step 2: keep only its checkpoints, resume into the same output_dir
    assert sorted(p.name for p in (out / "dcp").glob("step_*")) == ["step_2"]
    for path in [final, out / "logs"]:
        shutil.rmtree(path)
    run_distributed(
        FULL,
        FULL_CONFIG,
        [*common, f"output_dir={out}", "context_parallel_dim=2", "resume_from_checkpoint=True"],
        tmp_path,
    )
    resumed = train_log(out)
    assert sorted(resumed) == [3, 4]
    worst_resumed = max(abs(resumed[s][k] - uninterrupted[s][k]) for s in resumed for k in ("loss", "lr"))
    print(f"full cp=2 resumed at step 2: max |resumed - uninterrupted| over steps 3-4 = {worst_resumed:.1e}")
    assert worst_resumed <= 1e-6
    resumed_logits = validation_logits(LlamaForCausalLM.from_pretrained(final, dtype=torch.float32), tiny_assets)
    torch.testing.assert_close(resumed_logits, cp_logits, atol=1e-5, rtol=0)


def test_lora_two_cp_ranks_match_one_device_and_adapter_loads_in_peft(tiny_assets, tmp_path):
    """LoRA from a random PEFT adapter (non-zero B) on padded rows: cp=2 equals one process, and the saved adapter
    loads in PEFT with the merged checkpoint's logits."""
    adapter = random_peft_adapter(tiny_assets, tmp_path / "start_adapter")
    overrides = [
        f"assets_dir={tiny_assets}",
        f"max_steps_per_epoch={STEPS}",
        f"checkpointer.adapter_checkpoint={adapter}",
        "batch_size=4",
        *PADDED,
    ]
    one, cp = tmp_path / "one", tmp_path / "cp2"
    _two_rank_run(LORA, LORA_CONFIG, overrides, tmp_path)
    worst = _compare(train_log(one), train_log(cp), "LoRA, cp=2")
    assert worst["loss"] < TOLERANCE and worst["grad_norm"] < TOLERANCE, worst

    from peft import PeftModel
    from transformers import LlamaForCausalLM

    final = cp / f"step_{STEPS}"
    merged = validation_logits(LlamaForCausalLM.from_pretrained(final, dtype=torch.float32), tiny_assets)
    base = LlamaForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32)
    with_adapter = validation_logits(PeftModel.from_pretrained(base, final / "adapter"), tiny_assets)
    torch.testing.assert_close(with_adapter, merged, atol=1e-5, rtol=0)  # the adapter is the merged update
    one_device = LlamaForCausalLM.from_pretrained(one / f"step_{STEPS}", dtype=torch.float32)
    logits_diff = (merged - validation_logits(one_device, tiny_assets)).abs().max().item()
    print(f"LoRA cp=2: max |logits(cp=2) - logits(1 device)| after {STEPS} steps = {logits_diff:.2e}")
    # at lr 1e-2 AdamW may move an adapter element whose gradient is rounding noise either way (measured: 1 of
    # 33k by 7.6e-4, 1e-4 to 2e-4 on the logits, with the order of the attention's sums): the adapters are
    # compared element by element instead
    from safetensors.torch import load_file

    adapters = [load_file(d / f"step_{STEPS}" / "adapter" / "adapter_model.safetensors") for d in (cp, one)]
    assert_close_after_adamw(*adapters, lr=1e-2, steps=STEPS)


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3"])
def test_other_families_two_cp_ranks_match_one_device(tiny_assets, tmp_path, name):  # tiny_assets: datasets' cache
    """The shipped distributed full config of Qwen2.5 (q/k/v biases, tied embeddings) and Qwen3 (q/k norms, tied
    embeddings), tiny (tests/recipes/_family_assets.py), on padded rows of 255 tokens (their tiny rows are 178-365)."""
    data = family.build_family_assets(name, tmp_path / "assets")
    config = tmp_path / "full.yaml"
    shutil.copyfile(family.CONFIGS / family.FAMILIES[name].distributed["full"], config)
    overrides = [
        *family.tiny_run_overrides(name, "full", data, tmp_path / "unused", STEPS),
        *("seed=0", "shuffle=False", "gradient_accumulation_steps=1", "log_peak_memory_stats=False"),
        *("lr_scheduler.num_warmup_steps=0", "optimizer.lr=1e-3", "metric_logger.filename=log.jsonl"),
        *PADDED,
    ]
    overrides = [o for o in overrides if not o.startswith("output_dir=")]  # _two_rank_run sets it
    batches = first_batches(config, [*overrides, "output_dir=unused"], 2, STEPS)
    assert all(b["tokens"].shape[1] % 4 for b in batches), [b["tokens"].shape for b in batches]
    _two_rank_run(FULL, config, overrides, tmp_path)
    worst = _compare(train_log(tmp_path / "one"), train_log(tmp_path / "cp2"), f"{name} full, padded, cp=2")
    assert worst["loss"] < TOLERANCE and worst["grad_norm"] < TOLERANCE, worst


@pytest.mark.parametrize(
    "recipe, config, extra, nproc, expected",
    [
        (FULL, FULL_CONFIG, ["context_parallel_dim=3"], 2, "context_parallel_dim=3 does not divide"),
        (FULL, FULL_CONFIG, ["context_parallel_dim=0"], 1, "context_parallel_dim = 0: must be a positive integer"),
        (FULL, FULL_CONFIG, ["context_parallel_dim=2", "compile=True"], 1, "2: cannot be combined with compile"),
        (LORA, LORA_CONFIG, ["context_parallel_dim=2", "compile=True"], 1, "2: cannot be combined with compile"),
        # a sliding window (Mistral's attention on the tiny Llama's weights) cannot be cut into chunks
        (
            FULL,
            FULL_CONFIG,
            ["context_parallel_dim=2", "model._component_=tune.models.mistral.mistral", "model.sliding_window=64"],
            2,
            "layers.0.attn has {'sliding_window': 64}",
        ),
    ],
    ids=["cp3_on_2_ranks", "cp0", "full_compile", "lora_compile", "sliding_window"],
)
def test_bad_context_parallel_settings_are_reported_without_a_traceback(
    tiny_assets, tmp_path, recipe, config, extra, nproc, expected
):
    overrides = _overrides(tiny_assets, tmp_path / "run", *extra)
    if nproc == 1:
        proc = run_recipe(recipe, config, overrides, cwd=tmp_path, check=False)
    else:
        proc = run_distributed(recipe, config, overrides, cwd=tmp_path, nproc=nproc, check=False)
    print(f"{extra}: {[line for line in proc.stderr.splitlines() if expected in line][-1:]}")
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_knowledge_distillation_refuses_context_parallelism(tiny_assets, tmp_path):
    overrides = [
        f"assets_dir={tiny_assets}",
        f"teacher_dir={tiny_assets / 'llama'}",
        f"output_dir={tmp_path / 'run'}",
        "context_parallel_dim=2",
    ]
    proc = run_distributed(
        "knowledge_distillation_distributed", ASSETS / "kd_tiny.yaml", overrides, cwd=tmp_path, check=False
    )
    print(f"KD: {[line for line in proc.stderr.splitlines() if 'context_parallel_dim' in line][-1:]}")
    assert proc.returncode == 1
    assert "context_parallel_dim" in proc.stderr and "distillation" in proc.stderr
    assert "Traceback" not in proc.stderr
