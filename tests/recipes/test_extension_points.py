"""Extension points through the unmodified single-device recipes: `model_converters`, `finetuning_schedule`, and
`imports:` of a user's module that registers an outside model family (issue 8).

Expected values come from independent runs in the test: the recipe's losses under QAT equal a plain loop over the
same fake-quantised model (tests/recipes/utils.py ``reference_run``), the outside GPT-2-style family trains exactly
like Hugging Face's ``GPT2LMHeadModel`` on the same checkpoint, and the schedule's claims are read off the weights
of the checkpoint saved after every step.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn

from tests.recipes.utils import (
    ASSETS,
    MAX_SEQ_LEN,
    ROOT,
    VOCAB_SIZE,
    loss_records,
    losses_by_step,
    pad_batch,
    read_jsonl,
    reference_run,
    run_recipe,
    tiny_dataset,
)
from tune import config
from tune.registry import get_model_family
from tune.training import QATConverter

pytestmark = pytest.mark.integration

FULL, LORA = "full_finetune_single_device", "lora_finetune_single_device"
FULL_CONFIG, LORA_CONFIG = ASSETS / "full_tiny.yaml", ASSETS / "lora_tiny.yaml"
LR, WEIGHT_DECAY = 1e-3, 0.01  # full_tiny.yaml
QAT = "model_converters=[{_component_: tune.training.Int8DynActInt4WeightQATConverter, groupsize: 32}]"
# three phases over the tiny Llama: the output side, then layer 1 (at half the lr), then layer 0's attention;
# layer 0's MLP, the layer norms and the embeddings match no phase and stay frozen
SCHEDULE = (
    "finetuning_schedule=[{params: [output, norm], transition: {after_steps: 1}}, "
    "{params: ['layers.1.*'], lr: 5e-4, transition: {after_steps: 2}}, {params: ['re:layers\\.0\\.attn\\..*']}]"
)


def _overrides(assets: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"output_dir={out}", *extra]


def _schedule_lines(stderr: str) -> list[str]:
    """The schedule's log lines: its description at setup (a header and one line per phase) and its transitions."""
    # a log line may follow the progress bar's last redraw on the same line of stderr
    lines = [line[line.index("INFO:") :] for line in stderr.splitlines() if "INFO:" in line]
    return [line for line in lines if "finetuning schedule" in line or re.search(r":\s+phase \d+:", line)]


def _assert_clear_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr[-3000:]


def _tune_llama(assets: Path, weights: Path) -> nn.Module:
    """The tiny config's tune model with the HF weights of ``weights`` (a checkpoint directory)."""
    model = config.instantiate(OmegaConf.load(FULL_CONFIG).model)
    hf_config = json.loads((weights / "config.json").read_text())
    model.load_state_dict(get_model_family("llama2").hf_to_tune(load_file(weights / "model.safetensors"), hf_config))
    return model


class _HFStyle(nn.Module):
    """Lets ``reference_run`` (which calls ``model(input_ids=...).logits``) train a tune model."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.model(input_ids))


def _token_accuracy(model: nn.Module, assets: Path) -> tuple[float, torch.Tensor]:
    """Next-token accuracy over every label of the validation split, and the logits."""
    dataset = tiny_dataset(assets, "val.json")
    tokens, labels = pad_batch([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(tokens)  # [b, s, vocab]
    scored = labels[:, 1:] != -100
    correct = (logits[:, :-1].argmax(-1) == labels[:, 1:]) & scored
    return correct.sum().item() / scored.sum().item(), logits


# ------------------------------------------------------------------------------------------------ model_converters


def test_qat_converter_trains_the_fake_quantised_model_and_it_quantises(tiny_assets, tmp_path):
    out = tmp_path / "run"
    # SGD at a stable lr: the recipe's chunked loss gives the loop's gradients to ~2e-7 (relative), noise that the
    # int4 rounding of the forward can amplify; measured: 1.4e-3 apart at step 3 with AdamW (whose first steps are
    # ~lr * sign(g)) and 8e-3 at step 2 with SGD at a diverging lr of 0.5, but within 1e-6 with SGD at lr 0.05
    sgd = ["optimizer._component_=torch.optim.SGD", "optimizer.lr=0.05", "max_steps_per_epoch=2"]
    proc = run_recipe(FULL, FULL_CONFIG, _overrides(tiny_assets, out, QAT, *sgd), cwd=tmp_path)
    # 2 layers x (q, k, v, output_proj, w1, w2, w3) + the output projection; every input size is a multiple of 32
    assert "QAT: fake-quantised 15 linear layers" in proc.stderr

    # reference: the same model, fake-quantised by the same converter, trained by the plain loop
    initial = _tune_llama(tiny_assets, tiny_assets / "llama")
    plain_loss, _, _ = reference_run(tiny_assets, 1, 4, 0.0, 0.0, _HFStyle(initial), torch.optim.SGD)  # lr 0
    reference = _HFStyle(QATConverter(groupsize=32).convert(initial))
    ref_losses, _, _ = reference_run(tiny_assets, 2, 4, 0.05, WEIGHT_DECAY, reference, torch.optim.SGD)
    losses = losses_by_step(out)
    print("QAT recipe losses", losses, "\nQAT reference    ", ref_losses, "\nwithout QAT      ", plain_loss)
    # the first step is the fake-quantised forward of the same weights: equal to 1e-5. The second comes after one
    # update, and int4 rounding turns the ~1e-7 relative difference between the recipe's gradient and the loop's
    # into whole quantisation steps of a few weights, by an amount that depends on the CPU's matmul kernels: within
    # 1e-6 on one machine, 3.3e-3 on another (2026-11-25). The update itself moves the loss by 0.46, so a wrongly
    # scaled one (a loss multiplied by the token count, half the learning rate) lands far outside 1e-2.
    assert losses[1] == pytest.approx(ref_losses[0], abs=1e-5, rel=0)
    assert losses[2] == pytest.approx(ref_losses[1], abs=1e-2, rel=0)
    # ... and the fake quantisation matters: the model without it scores the first batch differently
    assert abs(losses[1] - plain_loss[0]) > 1e-3

    # the saved checkpoint has plain weights; quantised for real it computes what the fake-quantised model did
    trained = _tune_llama(tiny_assets, out / "step_2")
    float_accuracy, _ = _token_accuracy(trained, tiny_assets)
    converter = QATConverter(groupsize=32)
    fake_accuracy, fake_logits = _token_accuracy(converter.convert(trained), tiny_assets)
    real_accuracy, real_logits = _token_accuracy(converter.quantize(trained), tiny_assets)
    max_diff = (real_logits - fake_logits).abs().max().item()
    print(
        f"QAT recipe run, validation next-token accuracy: float {float_accuracy:.4f}, fake-quantised "
        f"{fake_accuracy:.4f}, int8/int4 {real_accuracy:.4f}; max |logit diff| {max_diff:.2e}"
    )
    assert real_accuracy == fake_accuracy
    assert max_diff < 1e-4 * fake_logits.abs().max().item()


def test_converters_in_a_wrong_order_are_refused_before_anything_is_loaded(tiny_assets, tmp_path):
    wrong = (
        "model_converters=[{_component_: tune.training.QATConverter}, "
        "{_component_: extension_components.LoRAConverter, target_modules: [q_proj]}]"
    )
    proc = run_recipe(FULL, FULL_CONFIG, _overrides(tiny_assets, tmp_path / "run", wrong), cwd=tmp_path, check=False)
    _assert_clear_error(
        proc,
        "model_converters[1] (LoRAConverter, kind 'peft') must run before model_converters[0] "
        "(Int8DynActInt4WeightQATConverter, kind 'qat'): move it up in `model_converters:`.",
    )
    assert "Model:" not in proc.stderr  # refused in __init__, before the checkpoint was read


def test_post_optimizer_hooks_run_after_each_step_with_optimizer_in_bwd(tiny_assets, tmp_path):
    out = tmp_path / "run"
    cap = "model_converters=[{_component_: extension_components.EmbeddingNormCapConverter, max_norm: 0.5}]"
    run_recipe(
        FULL, FULL_CONFIG, _overrides(tiny_assets, out, cap, "optimizer_in_bwd=True", "optimizer.lr=1e-2"), cwd=tmp_path
    )
    base = load_file(tiny_assets / "llama" / "model.safetensors")["model.embed_tokens.weight"]
    trained = load_file(out / "step_3" / "model.safetensors")["model.embed_tokens.weight"]
    # convert() capped the rows (initially ~0.08 * sqrt(128) = 0.9 long) to 0.5; Adam's steps of ~lr per
    # coordinate lengthen the rows they touch (measured with the hook left out: 69 rows longer than 0.5, up to
    # 0.58, after 3 steps), and the hook, run after each step, brings them back
    capped = base * torch.clamp(0.5 / base.norm(dim=-1, keepdim=True), max=1.0)
    assert not torch.allclose(trained, capped)  # training moved the embeddings
    assert trained.norm(dim=-1).max().item() <= 0.5 + 1e-5


# --------------------------------------------------------------------------------------------- finetuning_schedule


def test_gradual_unfreezing_trains_each_phase_only_after_its_transition_and_resumes_mid_schedule(tiny_assets, tmp_path):
    common = [SCHEDULE, "max_steps_per_epoch=4", "save_every_n_steps=1"]
    out = tmp_path / "run"
    proc = run_recipe(FULL, FULL_CONFIG, _overrides(tiny_assets, out, *common), cwd=tmp_path)
    lines = _schedule_lines(proc.stderr)
    print("\n".join(lines))
    transitions = [line for line in lines if " -> " in line]
    assert len(transitions) == 2
    assert re.search(
        r"phase 0 -> 1 at step 1 \(epoch 0, after_steps=1 reached\): 9 tensors \([\d,]+ values\) "
        r"matching layers\.1\.\* join the optimizer as param group 1 \(lr 0\.0005\)",
        transitions[0],
    )
    assert re.search(
        r"phase 1 -> 2 at step 3 \(epoch 0, after_steps=2 reached\): 4 tensors \([\d,]+ values\) "
        r"matching re:layers\\\.0\\\.attn\\\.\.\* join the optimizer as param group 2",
        transitions[1],
    )

    # which weights each checkpoint changed, against the initial ones (HF names)
    base = load_file(tiny_assets / "llama" / "model.safetensors")
    saved = {step: load_file(out / f"step_{step}" / "model.safetensors") for step in (1, 2, 3, 4)}

    def changed(step: int, prefix: str) -> bool:
        keys = [k for k in base if k.startswith(prefix)]
        assert keys, prefix
        return any(not torch.equal(saved[step][k], base[k]) for k in keys)

    phases = {"lm_head.": 1, "model.norm.": 1, "model.layers.1.": 2, "model.layers.0.self_attn.": 4}
    for prefix, first_step in phases.items():  # trained from the step after its phase began, never before
        assert [changed(step, prefix) for step in (1, 2, 3, 4)] == [step >= first_step for step in (1, 2, 3, 4)]
    for prefix in ("model.embed_tokens.", "model.layers.0.mlp.", "model.layers.0.input_layernorm."):
        assert not changed(4, prefix), prefix  # in no phase: frozen throughout

    # "crash" after step 2, in phase 1: resuming restores the phase (and its start) and the run goes on identically
    uninterrupted = losses_by_step(out)
    for name in ("step_3", "step_4", "logs"):
        shutil.rmtree(out / name)
    proc = run_recipe(
        FULL, FULL_CONFIG, _overrides(tiny_assets, out, *common, "resume_from_checkpoint=True"), cwd=tmp_path
    )
    assert "finetuning schedule: resumed in phase 1 of 3 (began at step 1, epoch 0)" in proc.stderr
    assert "phase 1 -> 2 at step 3" in proc.stderr
    resumed = losses_by_step(out)
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(uninterrupted[step], abs=1e-6, rel=0), step


def test_on_plateau_transition_follows_the_validation_loss(tiny_assets, tmp_path):
    # phase 0 trains at lr 0 (AdamW's decoupled decay is scaled by lr too): the validation loss stays exactly the
    # same, so the first validation sets the best and the second, not improving on it, ends the phase
    val = [
        "dataset_val._component_=tune.datasets.alpaca_dataset",
        "dataset_val.source=json",
        f"dataset_val.data_files={tiny_assets}/val.json",
        "dataset_val.split=train",
        "dataset_val.train_on_input=False",
        "run_val_every_n_steps=1",
    ]
    schedule = "finetuning_schedule=[{params: [output], lr: 0.0, transition: {on_plateau: 1}}, {params: [norm]}]"
    out = tmp_path / "run"
    proc = run_recipe(FULL, FULL_CONFIG, _overrides(tiny_assets, out, schedule, *val), cwd=tmp_path)
    val_losses = [r["val_loss"] for r in read_jsonl(out / "logs" / "log.jsonl") if "val_loss" in r]
    assert len(val_losses) == 3 and val_losses[0] == val_losses[1] != val_losses[2]
    transitions = [line for line in _schedule_lines(proc.stderr) if " -> " in line]
    assert len(transitions) == 1 and "phase 0 -> 1 at step 2 (epoch 0, on_plateau=1 reached)" in transitions[0]


def test_auto_schedule_unfreezes_lora_adapters_from_the_last_layer(tiny_assets, tmp_path):
    out = tmp_path / "run"
    extra = [
        "finetuning_schedule=auto",
        "finetuning_schedule_auto_transition={after_steps: 1}",
        "save_every_n_steps=1",
        "save_adapter_weights_only=True",
    ]
    proc = run_recipe(LORA, LORA_CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)
    # the adapters are all inside layers.0 / layers.1: one phase per layer, the last layer first
    assert "finetuning schedule: 2 phases" in proc.stderr
    assert "phase 0 -> 1 at step 1 (epoch 0, after_steps=1 reached)" in proc.stderr
    assert "matching layers.0.* join the optimizer as param group 1" in proc.stderr

    # lora_b starts at zero (LoRALinear's documented init): it is nonzero exactly where the adapter trained
    def trained(step: int, layer: int) -> bool:
        adapter = load_file(out / f"step_{step}" / "adapter" / "adapter_model.safetensors")
        return any(v.abs().sum() > 0 for k, v in adapter.items() if f"layers.{layer}." in k and "lora_B" in k)

    assert [trained(1, 1), trained(1, 0)] == [True, False]
    assert [trained(2, 1), trained(2, 0)] == [True, True]


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["optimizer_in_bwd=True"], ["finetuning_schedule: cannot be combined with optimizer_in_bwd: True"]),
        (
            ["finetuning_schedule=[{params: [output], transition: {after_steps: 1}}, {params: ['layers.7.*']}]"],
            ["finetuning_schedule[1].params: 'layers.7.*' matches no parameter"],
        ),
    ],
    ids=["optimizer_in_bwd", "unmatched_pattern"],
)
def test_a_schedule_that_cannot_run_is_a_clear_error(tiny_assets, tmp_path, extra, fragments):
    schedule = [] if any(e.startswith("finetuning_schedule") for e in extra) else [SCHEDULE]
    proc = run_recipe(
        FULL, FULL_CONFIG, _overrides(tiny_assets, tmp_path / "run", *schedule, *extra), cwd=tmp_path, check=False
    )
    _assert_clear_error(proc, *fragments)


# ------------------------------------------------------------------------------------- imports: an outside family


GPT2_SIZES = dict(n_embd=64, n_layer=2, n_head=4)
OUTSIDE_MODEL = dict(vocab_size=VOCAB_SIZE, num_layers=2, num_heads=4, embed_dim=64, max_seq_len=MAX_SEQ_LEN)


@pytest.fixture
def outside_project(tiny_assets, tmp_path) -> tuple[Path, Path]:
    """A user's folder holding ``my_project/components.py`` (tests/recipes/_outside_family.py), a GPT-2 checkpoint
    written by ``transformers``, and a config for the full recipe naming both; returns (folder, config)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    user = tmp_path / "user"
    (user / "my_project").mkdir(parents=True)
    (user / "my_project" / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parent / "_outside_family.py", user / "my_project" / "components.py")
    gpt2 = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=MAX_SEQ_LEN,
        tie_word_embeddings=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=2,
        **GPT2_SIZES,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(gpt2).save_pretrained(user / "gpt2")

    cfg = OmegaConf.load(FULL_CONFIG)  # the tiny Llama config with the model swapped: same data and training
    cfg.imports = ["my_project.components"]
    cfg.model = {"_component_": "my_project.components.outside_gpt", **OUTSIDE_MODEL}
    cfg.checkpointer.checkpoint_dir = str(user / "gpt2")
    cfg.checkpointer.model_type = "OUTSIDE_GPT"
    cfg.loss = {"_component_": "tune.modules.loss.CEWithChunkedOutputLoss", "num_output_chunks": 4}
    path = user / "outside.yaml"
    OmegaConf.save(cfg, path)
    return user, path


def test_imports_register_an_outside_family_that_the_unmodified_recipe_and_checkpointer_fine_tune(
    tiny_assets, tmp_path, outside_project
):
    from transformers import GPT2LMHeadModel

    user, config_path = outside_project
    out = tmp_path / "run"
    run_recipe(FULL, config_path, _overrides(tiny_assets, out), cwd=tmp_path, env={"PYTHONPATH": str(user)})

    # reference: Hugging Face's GPT-2 on the same checkpoint, trained by the plain loop
    ref_losses, ref_grad_norms, ref_model = reference_run(
        tiny_assets, 3, 4, LR, WEIGHT_DECAY, model=GPT2LMHeadModel.from_pretrained(user / "gpt2", dtype=torch.float32)
    )
    records = loss_records(out)
    assert [r["loss"] for r in records] == pytest.approx(ref_losses, abs=1e-5, rel=0)
    assert [r["grad_norm"] for r in records] == pytest.approx(ref_grad_norms, rel=1e-4)

    # the saved checkpoint is a GPT-2 checkpoint again (same keys, shapes, dtypes) that transformers loads
    original, saved = load_file(user / "gpt2" / "model.safetensors"), load_file(out / "step_3" / "model.safetensors")
    assert saved.keys() == original.keys()
    assert all(saved[k].shape == original[k].shape and saved[k].dtype == original[k].dtype for k in original)
    reloaded = GPT2LMHeadModel.from_pretrained(out / "step_3", dtype=torch.float32)
    ref_params = dict(ref_model.named_parameters())
    for name, param in reloaded.named_parameters():
        torch.testing.assert_close(param, ref_params[name], atol=2e-5, rtol=0, msg=name)


def test_tune_validate_honours_imports_and_checks_schedule_patterns_against_the_model(outside_project):
    user, config_path = outside_project

    def validate(*overrides: str) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            "-m",
            "tune._cli.main",
            "validate",
            str(config_path),
            "--recipe",
            FULL,
            "assets_dir=/data",
            "output_dir=/tmp/out",
            *overrides,
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user), str(ROOT)])}
        return subprocess.run(cmd, cwd=user, env=env, capture_output=True, text=True, timeout=120)

    good = (
        "finetuning_schedule=[{params: [lm_head, final_norm], transition: {after_steps: 1}}, {params: ['blocks.1.*']}]"
    )
    proc = validate(good)
    assert proc.returncode == 0 and f"OK: {config_path} is valid for recipe {FULL}" in proc.stdout, proc.stdout

    bad = "finetuning_schedule=[{params: [lm_head], transition: {after_steps: 1}}, {params: ['layers.1.*']}]"
    proc = validate(bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "finetuning_schedule[1].params: 'layers.1.*' matches no parameter" in proc.stdout
    assert "Traceback" not in proc.stderr

    proc = validate("imports=[my_project.components, my_project.missing]")
    assert proc.returncode == 1
    assert (
        "imports[1] = 'my_project.missing': cannot import the module: there is no module named 'my_project.missing'"
    ) in proc.stdout


# ------------------------------------------------------------------------------- a copied recipe's loss_step metrics


def test_metrics_returned_by_a_copied_recipes_loss_step_are_logged_as_numbers(tiny_assets, tmp_path):
    # `tune cp` then an edited loss_step: it returns tensors (read only at logging steps) and a plain float
    source = (ROOT / "recipes" / f"{FULL}.py").read_text()
    original = '        return self._router_aux_loss(self._loss_fn(outputs, labels), batch["tokens"], labels)\n'
    edited = (
        "        metrics = {\n"
        "            'num_label_tokens': (labels != CROSS_ENTROPY_IGNORE_IDX).sum(),\n"
        "            'label_fraction': (labels != CROSS_ENTROPY_IGNORE_IDX).sum() / (batch['tokens'] != 0).sum(),\n"
        "            'loss_weight': 0.5,\n"
        "        }\n"
        "        loss, moe_metrics = self._router_aux_loss(self._loss_fn(outputs, labels), batch['tokens'], labels)\n"
        "        return loss, {**moe_metrics, **metrics}\n"
    )
    assert source.count(original) == 1, "the recipe's loss_step changed: update this test's edit"
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(source.replace(original, edited))
    out = tmp_path / "run"
    extra = ["max_steps_per_epoch=4", "log_every_n_steps=2"]
    run_recipe(str(recipe), FULL_CONFIG, _overrides(tiny_assets, out, *extra), cwd=tmp_path)
    records = loss_records(out)
    assert [r["step"] for r in records] == [2, 4]

    # expected: the last micro-batch of each logging step (batch_size 4, no shuffle: samples 4-7 and 12-15),
    # counted on the dataset's samples (padding_free_collate pads the row with id 0, which no sample uses)
    dataset = tiny_dataset(tiny_assets)
    for record in records:
        samples = [dataset[i] for i in range(4 * (record["step"] - 1), 4 * record["step"])]
        label_tokens = sum(sum(label != -100 for label in s["labels"][1:]) for s in samples)
        assert type(record["num_label_tokens"]) is int and record["num_label_tokens"] == label_tokens
        fraction = label_tokens / sum(len(s["tokens"]) for s in samples)
        assert type(record["label_fraction"]) is float and record["label_fraction"] == pytest.approx(fraction)
        assert record["loss_weight"] == 0.5
