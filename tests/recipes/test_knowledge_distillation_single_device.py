"""Integration tests of recipes/knowledge_distillation_single_device.py: `tune run` on tiny Llamas for a few steps.

The student is the tiny Llama of tests/recipes/utils.py with LoRA (tests/recipes/assets/kd_tiny.yaml); the
teacher is a larger tiny Llama (3 layers, wider MLP, same vocabulary) written here with ``transformers``. The
reference is a plain PyTorch loop over Hugging Face models: PEFT on ``transformers`` for the student,
``F.cross_entropy`` and ``F.kl_div`` for the two losses, mixed with ``kd_ratio`` and normalised over the step's
loss tokens, ``torch.optim.AdamW``.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests._helpers import assert_close_after_adamw
from tests.recipes.utils import (
    ASSETS,
    MAX_POSITIONS,
    VOCAB_SIZE,
    loss_records,
    pad_batch,
    random_peft_adapter,
    run_recipe,
    save_spread_hf_model,
    tiny_dataset,
)

pytestmark = pytest.mark.integration

RECIPE = "knowledge_distillation_single_device"
CONFIG = ASSETS / "kd_tiny.yaml"
LR, WEIGHT_DECAY, KD_RATIO = 1e-2, 0.01, 0.5
NUM_STEPS, BATCH_SIZE, ACCUMULATE = 3, 2, 2
# the student's own size, for a teacher equal to it (kd_tiny.yaml's teacher_model is 3 layers, MLP 384)
SAME_AS_STUDENT = ["teacher_model.num_layers=2", "teacher_model.intermediate_dim=256"]


def _save_hf_llama(path: Path, num_layers: int, intermediate_size: int, seed: int, vocab_size: int = VOCAB_SIZE):
    """A random tiny Llama in the HF format, initialised like tests/recipes/utils.py's student."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    save_spread_hf_model(LlamaForCausalLM(config).to(torch.float32), path)
    return path


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return _save_hf_llama(tmp_path_factory.mktemp("teacher") / "hf", num_layers=3, intermediate_size=384, seed=1)


def _overrides(assets: Path, teacher: Path, out: Path, *extra: str) -> list[str]:
    return [f"assets_dir={assets}", f"teacher_dir={teacher}", f"output_dir={out}", *extra]


def test_kd_term_is_zero_at_step_1_when_the_teacher_equals_the_student(tiny_assets, tmp_path):
    # the student's LoRA starts at B = 0, so at step 1 it computes exactly the teacher's logits
    out = tmp_path / "run"
    overrides = _overrides(tiny_assets, tiny_assets / "llama", out, *SAME_AS_STUDENT, "max_steps_per_epoch=1")
    run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path)
    (first,) = loss_records(out)
    print(f"step 1: kd_loss {first['kd_loss']!r}, class_loss {first['class_loss']:.6f}, loss {first['loss']:.6f}")
    assert first["kd_loss"] == 0.0
    assert first["class_loss"] > 1.0
    assert first["loss"] == pytest.approx((1 - KD_RATIO) * first["class_loss"], abs=1e-6)


@pytest.fixture(scope="module")
def kd_run(tiny_assets, teacher_dir, tmp_path_factory):
    """3 steps of 2 micro-batches of 2 samples from a random PEFT adapter, a checkpoint after each step."""
    root = tmp_path_factory.mktemp("kd_run")
    adapter = random_peft_adapter(tiny_assets, root / "initial_adapter")
    out = root / "run"
    extra = [
        f"checkpointer.adapter_checkpoint={adapter}",
        f"batch_size={BATCH_SIZE}",
        f"gradient_accumulation_steps={ACCUMULATE}",
        f"max_steps_per_epoch={NUM_STEPS}",
        "save_every_n_steps=1",
    ]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, teacher_dir, out, *extra), cwd=root)
    return {"root": root, "out": out, "adapter": adapter, "extra": extra}


def _reference_loop(assets: Path, teacher_dir: Path, adapter: Path):
    """Plain PyTorch: the same samples in order, the same mixed loss, normalised over each step's loss tokens."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    student = PeftModel.from_pretrained(base, adapter, is_trainable=True).train()
    teacher = LlamaForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False)
    dataset = tiny_dataset(assets)
    records = []
    for step in range(NUM_STEPS):
        first = step * BATCH_SIZE * ACCUMULATE
        micro = [pad_batch([dataset[first + m * BATCH_SIZE + i] for i in range(BATCH_SIZE)]) for m in range(ACCUMULATE)]
        num_tokens = sum((labels[:, 1:] != -100).sum() for _, labels in micro)
        totals = torch.zeros(3)
        for tokens, labels in micro:
            logits = student(input_ids=tokens).logits[:, :-1]  # position t predicts token t + 1
            with torch.no_grad():
                teacher_logits = teacher(input_ids=tokens).logits[:, :-1]
            targets = labels[:, 1:]
            keep = targets != -100
            ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
            # KL(teacher || student) per position; F.kl_div(input=log q, target=log p) = sum p (log p - log q)
            kl = F.kl_div(
                F.log_softmax(logits, -1), F.log_softmax(teacher_logits, -1), log_target=True, reduction="none"
            ).sum(-1)
            kd = kl[keep].sum()
            loss = ((1 - KD_RATIO) * ce + KD_RATIO * kd) / num_tokens
            loss.backward()
            totals += torch.stack([loss.detach(), ce.detach() / num_tokens, kd.detach() / num_tokens])
        optimizer.step()
        optimizer.zero_grad()
        records.append(dict(zip(("loss", "class_loss", "kd_loss"), totals.tolist())))
    return records, student


def test_losses_equal_a_plain_pytorch_loop(kd_run, tiny_assets, teacher_dir):
    records = loss_records(kd_run["out"])
    reference, ref_student = _reference_loop(tiny_assets, teacher_dir, kd_run["adapter"])
    worst = 0.0
    for key in ("loss", "class_loss", "kd_loss"):
        ours, theirs = [r[key] for r in records], [r[key] for r in reference]
        print(f"{key:10s} recipe {ours}\n{'':10s} plain  {theirs}")
        worst = max(worst, max(abs(a - b) for a, b in zip(ours, theirs)))
        # step 1 is the same float32 math; later steps follow AdamW updates, whose first moves each weight by about
        # lr * sign(grad): gradient entries at rounding level may go either way and shift the loss by a few 1e-6
        # relative (measured up to 2.2e-6)
        assert ours == pytest.approx(theirs, abs=0, rel=1e-5)
    print(f"max |recipe - plain loop| over the 3 steps: {worst:.1e}")
    assert all(r["kd_loss"] > 0.1 for r in records)  # the teacher differs: the KD term is not trivially 0

    # and the saved adapter is the plain loop's after the same 3 steps
    from safetensors.torch import load_file

    saved = load_file(kd_run["out"] / f"step_{NUM_STEPS}" / "adapter" / "adapter_model.safetensors")
    reference_adapter = {k.replace(".default", ""): v for k, v in ref_student.state_dict().items() if "lora_" in k}
    assert_close_after_adamw(saved, reference_adapter, lr=1e-2, steps=NUM_STEPS)  # kd_tiny.yaml's lr


def test_resume_equals_the_uninterrupted_run(kd_run, tiny_assets, teacher_dir):
    out, root = kd_run["out"], kd_run["root"]
    resumed = root / "resumed"  # the run as a crash after step 1 leaves it
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "logs")
    for step in range(2, NUM_STEPS + 1):
        shutil.rmtree(resumed / f"step_{step}")
    overrides = _overrides(tiny_assets, teacher_dir, resumed, *kd_run["extra"], "resume_from_checkpoint=True")
    run_recipe(RECIPE, CONFIG, overrides, cwd=root)

    uninterrupted = {r["step"]: r for r in loss_records(out)}
    after = loss_records(resumed)
    assert [r["step"] for r in after] == list(range(2, NUM_STEPS + 1))
    for record in after:
        for key in ("loss", "class_loss", "kd_loss"):
            assert record[key] == pytest.approx(uninterrupted[record["step"]][key], abs=1e-6, rel=0), key
    from safetensors.torch import load_file

    final = f"step_{NUM_STEPS}/adapter/adapter_model.safetensors"
    for key, value in load_file(out / final).items():
        torch.testing.assert_close(load_file(resumed / final)[key], value, atol=1e-6, rtol=0, msg=key)


def test_outputs_load_in_transformers_and_peft(kd_run, tiny_assets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    step_dir = kd_run["out"] / f"step_{NUM_STEPS}"
    merged, info = AutoModelForCausalLM.from_pretrained(step_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    base = AutoModelForCausalLM.from_pretrained(tiny_assets / "llama", dtype=torch.float32).eval()
    tokens = torch.randint(3, VOCAB_SIZE, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        base_logits = base(input_ids=tokens).logits
        peft_logits = PeftModel.from_pretrained(base, step_dir / "adapter").eval()(input_ids=tokens).logits
        merged_logits = merged.eval()(input_ids=tokens).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-4, rtol=1e-4)
    assert (peft_logits - base_logits).abs().max() > 1e-2  # the adapter matters: the comparison means something
    # the teacher is not part of the output
    assert json.loads((step_dir / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_teacher_with_another_vocabulary_is_a_config_error_naming_both_keys(tiny_assets, tmp_path):
    teacher = _save_hf_llama(tmp_path / "teacher", num_layers=2, intermediate_size=256, seed=2, vocab_size=384)
    overrides = _overrides(tiny_assets, teacher, tmp_path / "run", *SAME_AS_STUDENT, "teacher_model.vocab_size=384")
    proc = run_recipe(RECIPE, CONFIG, overrides, cwd=tmp_path, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "teacher_model" in output and "vocabulary of 384 tokens" in output and "(model) has 320" in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_kd_brings_the_students_held_out_loss_towards_the_teachers(tiny_assets, tmp_path):
    """A 3-layer teacher fine-tuned on the tiny arithmetic task (plain loop here) is distilled (kd_ratio 1: the
    labels play no part) into the 2-layer student; on held-out rows (val.json) the student's cross-entropy and its
    KL from the teacher must move towards the teacher."""
    from transformers import LlamaForCausalLM

    teacher_dir = _save_hf_llama(tmp_path / "teacher_init", num_layers=3, intermediate_size=384, seed=1)
    teacher = LlamaForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).train()
    train = tiny_dataset(tiny_assets)
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=2e-3, weight_decay=0.0)
    for _ in range(4):  # epochs
        for first in range(0, len(train), 4):
            tokens, labels = pad_batch([train[i] for i in range(first, first + 4)])
            logits = teacher(input_ids=tokens).logits[:, :-1]
            F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100).backward()
            optimizer.step()
            optimizer.zero_grad()
    teacher.save_pretrained(tmp_path / "teacher", safe_serialization=True)

    out = tmp_path / "run"
    extra = ["kd_ratio=1.0", "epochs=3", "max_steps_per_epoch=null", "optimizer.lr=3e-3"]
    run_recipe(RECIPE, CONFIG, _overrides(tiny_assets, tmp_path / "teacher", out, *extra), cwd=tmp_path, timeout=600)

    held_out = tiny_dataset(tiny_assets, "val.json")
    tokens, labels = pad_batch([held_out[i] for i in range(len(held_out))])
    targets = labels[:, 1:]

    def scores(model_dir: Path) -> tuple[float, float]:
        """(cross-entropy on the held-out answers, KL(teacher || model) on the same positions), per token."""
        model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=tokens).logits[:, :-1]
            teacher_logits = teacher.eval()(input_ids=tokens).logits[:, :-1]
        keep = targets != -100
        ce = F.cross_entropy(logits[keep], targets[keep]).item()
        log_student, log_teacher = F.log_softmax(logits[keep], -1), F.log_softmax(teacher_logits[keep], -1)
        kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(-1).mean().item()
        return ce, kl

    teacher_ce, _ = scores(tmp_path / "teacher")
    before_ce, before_kl = scores(tiny_assets / "llama")
    after_ce, after_kl = scores(out / f"step_{3 * len(train) // 4}")  # 3 epochs of 48 samples in batches of 4
    print(
        f"held-out cross-entropy: teacher {teacher_ce:.3f}, student before {before_ce:.3f}, after {after_ce:.3f}\n"
        f"held-out KL(teacher || student): before {before_kl:.3f}, after {after_kl:.3f}"
    )
    assert teacher_ce < before_ce
    # the gap to the teacher at least halves, and so does the divergence from it
    assert after_ce - teacher_ce < 0.5 * (before_ce - teacher_ce)
    assert after_kl < 0.5 * before_kl
