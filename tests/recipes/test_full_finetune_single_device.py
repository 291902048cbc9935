"""Integration tests of recipes/full_finetune_single_device.py: `tune run` on a tiny Llama for a few steps.

Expected losses come from an independent plain-PyTorch loop (tests/recipes/utils.py ``reference_run``):
the same checkpoint loaded with ``transformers``, ``torch.optim.AdamW`` and ``F.cross_entropy`` on full logits.
"""

import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.recipes.utils import (
    ASSETS,
    loss_records,
    losses_by_step,
    pad_batch,
    read_jsonl,
    reference_run,
    run_recipe,
    tiny_dataset,
)

pytestmark = pytest.mark.integration

RECIPE = "full_finetune_single_device"
CONFIG = ASSETS / "full_tiny.yaml"
LR, WEIGHT_DECAY = 1e-3, 0.01


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", *extra]


def test_first_losses_match_plain_pytorch_loop(tiny_assets, tmp_path):
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out), cwd=tmp_path)
    records = loss_records(out)
    ref_losses, ref_grad_norms, ref_model = reference_run(tiny_assets, 3, 4, lr=LR, weight_decay=WEIGHT_DECAY)

    assert [r["step"] for r in records] == [1, 2, 3]
    losses = [r["loss"] for r in records]
    print("recipe losses   ", losses, "\nreference losses", ref_losses)
    assert losses == pytest.approx(ref_losses, abs=1e-5, rel=0)
    assert [r["grad_norm"] for r in records] == pytest.approx(ref_grad_norms, rel=1e-4)
    for r in records:  # what every logging step carries
        assert r["lr"] == pytest.approx(LR) and r["tokens_per_second"] > 0

    # the final checkpoint is a Hugging Face model equal to the reference model after the same 3 steps
    from transformers import LlamaForCausalLM

    saved = LlamaForCausalLM.from_pretrained(out / "step_3", dtype=torch.float32)
    ref_params = dict(ref_model.named_parameters())
    for name, param in saved.named_parameters():
        torch.testing.assert_close(param, ref_params[name], atol=1e-4, rtol=0, msg=name)
    assert (out / "config.yaml").is_file() and (out / "step_3" / "config.yaml").is_file()


def test_gradient_accumulation_2x2_equals_1x4(tiny_assets, tmp_path):
    # SGD, not AdamW: its update is linear in the gradient, so rounding differences between the two ways of
    # summing stay at float32 noise instead of being blown up by Adam's first-step normalisation (~sign(g) * lr)
    sgd = ["optimizer._component_=torch.optim.SGD", "optimizer.lr=0.5"]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "a", *sgd, "batch_size=4"), cwd=tmp_path)
    run_recipe(
        RECIPE,
        CONFIG,
        _overrides(tiny_assets, tmp_path / "b", *sgd, "batch_size=2", "gradient_accumulation_steps=2"),
        cwd=tmp_path,
    )
    big, accumulated = loss_records(tmp_path / "a"), loss_records(tmp_path / "b")
    assert len(big) == len(accumulated) == 3
    assert [r["loss"] for r in accumulated] == pytest.approx([r["loss"] for r in big], abs=1e-5, rel=0)
    assert [r["grad_norm"] for r in accumulated] == pytest.approx([r["grad_norm"] for r in big], rel=1e-5)


@pytest.mark.parametrize("seed", ["0", "null"])
def test_resume_mid_epoch_reproduces_the_uninterrupted_run(tiny_assets, tmp_path, seed):
    # 2 epochs of 3 steps, shuffled, accumulation 2; checkpoints after steps 2 (mid-epoch), 3, 4 and 6. With
    # seed: null (the shipped configs' default) each process draws a seed: the resumed run must take the run's
    common = [
        f"seed={seed}",
        "shuffle=True",
        "batch_size=2",
        "gradient_accumulation_steps=2",
        "epochs=2",
        "save_every_n_steps=2",
        "lr_scheduler._component_=tune.training.get_cosine_schedule_with_warmup",
        "lr_scheduler.num_warmup_steps=1",
    ]
    out = tmp_path / "run"
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *common), cwd=tmp_path)
    uninterrupted = losses_by_step(out)
    assert sorted(uninterrupted) == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in out.glob("step_*")) == ["step_2", "step_3", "step_4", "step_6"]

    # "crash" after step 2: keep only its checkpoint, then resume into the same output_dir
    for name in ("step_3", "step_4", "step_6", "logs"):
        shutil.rmtree(out / name)
    proc = run_recipe(
        RECIPE, CONFIG, _overrides(tiny_assets, out, *common, "resume_from_checkpoint=True"), cwd=tmp_path
    )
    assert ("seed: null: resuming with the run's seed" in proc.stderr) == (seed == "null")
    resumed = losses_by_step(out)
    assert sorted(resumed) == [3, 4, 5, 6]
    for step in resumed:  # exact: same data order, optimizer state, LR schedule and RNG
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step


def test_a_list_of_datasets_trains_on_their_concatenation(tiny_assets, tmp_path):
    # torchtune's form: `dataset: [{...}, {...}]` builds each and concatenates them; without shuffling the first
    # steps see the first dataset's batches exactly as a run on that dataset alone does
    runs = {}
    data_files = f"{tiny_assets}/train.json"
    node = (
        f"{{_component_: tune.datasets.alpaca_dataset, source: json, data_files: {data_files}, split: train, "
        "train_on_input: False}"
    )
    for name, extra in [("single", []), ("listed", [f"dataset=[{node}, {node}]"])]:
        out = tmp_path / name
        proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "max_steps_per_epoch=2", *extra), cwd=tmp_path)
        found = re.search(r"Dataset (tune\.\S+(?: \+ tune\.\S+)*): (\d+) samples", proc.stderr)
        runs[name] = (found.group(1), int(found.group(2)), [r["loss"] for r in loss_records(out)])
    assert runs["listed"][0] == "tune.datasets.alpaca_dataset + tune.datasets.alpaca_dataset"
    assert runs["listed"][1] == 2 * runs["single"][1]
    assert runs["listed"][2] == pytest.approx(runs["single"][2], abs=1e-6, rel=0)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "clip_grad_nrom=1.0",
            "clip_grad_nrom: unknown key: the recipe does not read it. did you mean 'clip_grad_norm'?",
        ),
        ("batch_sizee=4", "batch_sizee: unknown key: the recipe does not read it. did you mean 'batch_size'?"),
        ("enable_activation_checkpionting=True", "did you mean 'enable_activation_checkpointing'?"),
        ("finetuning_scheduel=auto", "did you mean 'finetuning_schedule'?"),
        ("model_convertors=[]", "did you mean 'model_converters'?"),
    ],
)
def test_an_unknown_top_level_key_is_an_error_with_the_closest_name(tiny_assets, tmp_path, override, expected):
    out = tmp_path / "run"
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, override), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or not list(out.glob("step_*"))


def test_validation_loss_is_logged_and_equals_the_checkpoint_loss(tiny_assets, tmp_path):
    out = tmp_path / "run"
    extra = [
        "dataset_val._component_=tune.datasets.alpaca_dataset",
        "dataset_val.source=json",
        f"dataset_val.data_files={tiny_assets}/val.json",
        "dataset_val.split=train",
        "dataset_val.train_on_input=False",
        "run_val_every_n_steps=3",
    ]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)
    val = [r for r in read_jsonl(out / "logs" / "log.jsonl") if "val_loss" in r]
    assert [r["step"] for r in val] == [3]

    # independent value: the saved step-3 model's mean loss over every validation token
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out / "step_3", dtype=torch.float32).eval()
    dataset = tiny_dataset(tiny_assets, "val.json")
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(dataset), 4):
            tokens, labels = pad_batch([dataset[i] for i in range(start, min(start + 4, len(dataset)))])
            logits = model(input_ids=tokens).logits
            total += F.cross_entropy(
                logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum"
            ).item()
            count += int((labels[:, 1:] != -100).sum())
    assert val[0]["val_loss"] == pytest.approx(total / count, abs=1e-5)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_assets, tmp_path):
    out = tmp_path / "run"
    extra = [
        "loss._component_=nan_loss.NaNAfterNCalls",
        "loss.num_finite_calls=2",
        "save_every_n_steps=1",
        "keep_last_n_checkpoints=1",
    ]
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "The training loss is nan at step 3" in proc.stderr
    assert "Traceback" not in proc.stderr  # a clear error, not a crash
    # steps 1 and 2 were finite and saved (step_1 then pruned: keep_last_n_checkpoints=1); step 3's loss is NaN,
    # so nothing was written after step 2 and its checkpoint is the one kept
    assert sorted(p.name for p in out.glob("step_*")) == ["step_2"]
    assert (out / "step_2" / "recipe_state.pt").is_file()
    assert [r["step"] for r in loss_records(out)] == [1, 2]


def test_non_finite_loss_between_logging_steps_stops_at_its_own_step(tiny_assets, tmp_path):
    # every step's loss is checked before the optimizer applies it, not only at logging steps: with
    # log_every_n_steps=10 and no save before the end of the epoch (step 6), the NaN of step 3 still stops the
    # run at step 3, before its update is applied
    out = tmp_path / "run"
    extra = [
        "loss._component_=nan_loss.NaNAfterNCalls",
        "loss.num_finite_calls=2",
        "log_every_n_steps=10",
        "max_steps_per_epoch=6",
    ]
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "The training loss is nan at step 3" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(out.glob("step_*"))


@pytest.mark.parametrize(
    "logger, expected_file",
    [
        ("tune.training.StdoutLogger", None),
        ("tune.training.DiskLogger", "log.jsonl"),
        ("tune.training.TensorBoardLogger", "events.out.tfevents.*"),
    ],
)
def test_every_metric_logger_writes_the_step_metrics(tiny_assets, tmp_path, logger, expected_file):
    out = tmp_path / "run"
    extra = [f"metric_logger._component_={logger}", "max_steps_per_epoch=2", "log_peak_memory_stats=True"]
    if "TensorBoard" in logger:
        extra.append("~metric_logger.filename")  # TensorBoard names its own event files
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)
    if expected_file is None:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("Step ")]
        assert len(lines) == 2
        for key in ("loss:", "lr:", "tokens_per_second:", "grad_norm:", "peak_memory_rss:"):
            assert key in lines[-1]
        return
    files = list((out / "logs").rglob(expected_file))
    assert files, f"{logger} wrote nothing under {out / 'logs'}"
    if expected_file == "log.jsonl":
        records = loss_records(out)
        assert [r["step"] for r in records] == [1, 2]
        assert {"loss", "lr", "tokens_per_second", "grad_norm", "peak_memory_rss"} <= set(records[-1])
    else:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(files[0].parent))
        events.Reload()
        assert {"loss", "lr", "tokens_per_second", "grad_norm"} <= set(events.Tags()["scalars"])
        assert [e.step for e in events.Scalars("loss")] == [1, 2]


def test_compile_checkpointing_optimizer_in_backward_collator_and_profiler_keep_the_losses(tiny_assets, tmp_path):
    # none of these may change the numbers: the losses still equal the plain PyTorch loop
    out = tmp_path / "run"
    extra = [
        "compile=True",
        "enable_activation_checkpointing=True",
        "enable_activation_offloading=True",  # no effect on CPU: warned about, not an error (test below)
        "optimizer_in_bwd=True",
        "collate_fn={_component_: user_components.PadToMultipleCollator, pad_to_multiple_of: 64}",
        "profiler.enabled=True",
        f"profiler.output_dir={out}/profile",
        "profiler.wait_steps=0",
        "profiler.warmup_steps=1",
        "profiler.active_steps=1",
    ]
    # aot_eager: dynamo's graph capture and AOTAutograd's forward/backward graphs, run without inductor's C++
    # codegen (slow to build on a CPU test machine; tests/gpu covers inductor)
    env = {"TORCH_COMPILE_BACKEND": "aot_eager"}
    proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path, env=env)
    ref_losses, _, _ = reference_run(tiny_assets, 3, batch_size=4, lr=LR, weight_decay=WEIGHT_DECAY)
    records = loss_records(out)
    assert [r["loss"] for r in records] == pytest.approx(ref_losses, abs=1e-5, rel=0)
    assert "grad_norm" not in records[0]  # with optimizer_in_bwd no full gradient ever exists
    assert "enable_activation_offloading=True is ignored" in proc.stderr
    assert list((out / "profile").glob("*trace.json*"))


def test_activation_offloading_on_cpu_changes_nothing_and_says_why(tiny_assets, tmp_path):
    runs = {}
    for name, extra in [("plain", []), ("offload", ["enable_activation_offloading=True"])]:
        out = tmp_path / name
        proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)
        runs[name] = (proc.stderr, loss_records(out), load_file(out / "step_3" / "model.safetensors"))
    stderr, records, weights = runs["offload"]
    assert (
        "enable_activation_offloading=True is ignored: enable_activation_offloading has no effect on CPU: "
        "activations already live in host memory"
    ) in stderr
    assert "is ignored" not in runs["plain"][0]
    # bit for bit: the same losses, gradient norms and trained weights (so the same gradients at every step)
    assert [(r["loss"], r["grad_norm"]) for r in records] == [(r["loss"], r["grad_norm"]) for r in runs["plain"][1]]
    assert weights.keys() == runs["plain"][2].keys()
    assert all(torch.equal(weights[k], runs["plain"][2][k]) for k in weights)


def test_packed_bf16_user_optimizer_and_scheduler(tiny_assets, tmp_path):
    out = tmp_path / "run"
    extra = [
        "dataset.packed=True",
        "max_steps_per_epoch=4",
        "log_every_n_steps=2",
        "optimizer._component_=user_components.AdamWWithUpdateNorm",
        "lr_scheduler={_component_: torch.optim.lr_scheduler.StepLR, step_size: 1, gamma: 0.5}",
    ]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "dtype=bf16", *extra), cwd=tmp_path)
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "fp32", "dtype=fp32", *extra), cwd=tmp_path)
    records, fp32 = loss_records(out), loss_records(tmp_path / "fp32")
    assert [r["step"] for r in records] == [r["step"] for r in fp32] == [2, 4]
    # bf16 keeps 8 significant bits: each value it stores is off by up to 2^-8 relative. The first step's loss
    # carries about one such error (the forward in bf16); every update applied to the bf16 weights adds about one
    # more, so the mean loss of steps 1..N may differ from the fp32 run's by N * 2^-8 relative. Measured here:
    # 2.8e-4 and 3.5e-3 for N = 2 and 4; a bf16 run that did not train would be ~10% off by step 4.
    for r, ref in zip(records, fp32):
        assert r["loss"] == pytest.approx(ref["loss"], rel=r["step"] * 2**-8, abs=0), r["step"]
        assert r["loss"] != ref["loss"]  # the run did compute in bf16
    # StepLR halves the LR after every step: after 2 and 4 steps, 1e-3 / 4 and 1e-3 / 16
    assert [r["lr"] for r in records] == pytest.approx([LR / 4, LR / 16])
    assert all(r["update_norm"] > 0 for r in records)  # the dict returned by the user's optimizer.step()
    # the checkpoint keeps the input's dtype (fp32) although training ran in bf16
    assert {t.dtype for t in load_file(out / "step_4" / "model.safetensors").values()} == {torch.float32}


def test_packed_padding_free_rows_train_as_padded_packs(tiny_assets, tmp_path):
    # the tiny config's collate_fn is tune.data.padding_free_collate: the packs' documents go end to end in one row
    # without the packs' padding. padded_collate_sft, torchtune's default, becomes padded_collate_packed because the
    # dataset is packed (decided from the dataset). Same losses and grad norms; on CPU the padded run gets a hint.
    runs = {}
    for name, extra in [("free", []), ("padded", ["collate_fn=tune.data.padded_collate_sft"])]:
        out = tmp_path / name
        proc = run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, out, "dataset.packed=True", *extra), cwd=tmp_path)
        runs[name] = loss_records(out)
        assert ("collate_fn=tune.data.padding_free_collate puts each batch" in proc.stderr) == (name == "padded")
    assert len(runs["free"]) == 3
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in runs["free"]] == pytest.approx([r[key] for r in runs["padded"]], abs=1e-5, rel=1e-5)
