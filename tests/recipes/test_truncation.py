"""A `max_seq_len` that cuts off the answers: no loss token in an epoch is an error, some such samples a warning.

Before, a run whose samples were all truncated before their answer logged loss 0.0 and grad norm 0.0 at every
step, wrote the base model as ``step_N`` and exited 0. The expected counts here come from the samples themselves,
built in this process (tests/recipes/utils.py ``tiny_dataset``): a sample trains nothing when all its labels
are -100.
"""

import pytest

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.dist_utils import run_distributed
from tests.recipes.utils import ASSETS, loss_records, run_recipe, tiny_dataset

pytestmark = pytest.mark.integration


def _overrides(assets, out, *extra):
    return [f"assets_dir={assets}", f"output_dir={out}", *extra]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error: " in line]


@pytest.mark.parametrize(
    "recipe, config",
    [
        ("lora_finetune_single_device", "lora_tiny.yaml"),
        ("full_finetune_single_device", "full_tiny.yaml"),
        ("knowledge_distillation_single_device", "kd_tiny.yaml"),
    ],
)
def test_every_answer_cut_off_is_an_error_and_writes_no_checkpoint(tiny_assets, tmp_path, recipe, config):
    extra = []
    if config == "kd_tiny.yaml":  # the teacher: the tiny model itself, at its size
        extra = [
            f"teacher_dir={tiny_assets / 'llama'}",
            "teacher_model.num_layers=2",
            "teacher_model.intermediate_dim=256",
        ]
    max_seq_len = 8  # shorter than every alpaca prompt of the tiny data
    dataset = tiny_dataset(tiny_assets, max_seq_len=max_seq_len)
    assert all(
        all(label == -100 for label in dataset[i]["labels"]) for i in range(len(dataset))
    )  # the premise: nothing to learn
    out = tmp_path / "run"
    proc = run_recipe(
        recipe,
        ASSETS / config,
        _overrides(tiny_assets, out, f"tokenizer.max_seq_len={max_seq_len}", *extra),
        cwd=tmp_path,
        check=False,
    )
    print(proc.stderr[-3000:])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = _error_lines(proc.stderr)
    print(line)
    assert line.startswith(f"{recipe}.py: error: Epoch 1 (3 steps) has no token to learn from")
    assert f"max_seq_len={max_seq_len}" in line
    assert "tokenizer.max_seq_len" in line and "train_on_input" in line
    assert not list(out.glob("step_*")) and not list(out.glob("epoch_*"))


def test_some_samples_cut_off_is_a_warning_with_their_count_and_the_run_trains(tiny_assets, tmp_path):
    max_seq_len = 256  # the tiny configs' own: a quarter of the tiny alpaca prompts are longer
    dataset = tiny_dataset(tiny_assets, max_seq_len=max_seq_len)
    empty = sum(all(label == -100 for label in dataset[i]["labels"]) for i in range(len(dataset)))
    assert 0 < empty < len(dataset) == 48  # the premise: some samples lose their answer, others keep it
    out = tmp_path / "run"
    proc = run_recipe(
        "lora_finetune_single_device",
        ASSETS / "lora_tiny.yaml",
        _overrides(tiny_assets, out, f"tokenizer.max_seq_len={max_seq_len}"),
        cwd=tmp_path,
    )
    warnings = [line for line in proc.stderr.splitlines() if "have no loss token" in line]
    print(warnings)
    assert len(warnings) == 1
    assert f"{empty} of 48 samples" in warnings[0] and f"max_seq_len={max_seq_len}" in warnings[0]
    assert all(r["loss"] > 0 for r in loss_records(out))
    assert (out / "step_3").is_dir()


def _assert_one_error_and_no_checkpoint(proc, recipe: str, out, max_seq_len: int) -> None:
    print(proc.stderr[-3000:])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    # one error line (under torchrun the launcher may print it instead of the recipe, naming the failed rank)
    lines = _error_lines(proc.stderr)
    message = "Epoch 1 (3 steps) has no token to learn from"
    assert lines and all(message in line and f"max_seq_len={max_seq_len}" in line for line in lines)
    assert lines[0].startswith((f"{recipe}.py: error: {message}", "tune: error: rank 0 failed: "))
    assert not list(out.glob("step_*")) and not list(out.glob("epoch_*"))


def test_dpo_pairs_cut_before_their_answers_are_an_error(tiny_assets, tmp_path):
    pairs = write_preference_messages(tmp_path / "pairs.json", 8, seed=0)
    out = tmp_path / "run"
    proc = run_recipe(
        "lora_dpo_single_device",
        ASSETS / "lora_dpo_tiny.yaml",
        _overrides(tiny_assets, out, f"dataset.data_files={pairs}", "tokenizer.max_seq_len=4"),
        cwd=tmp_path,
        check=False,
    )
    assert "8 of 8 samples have no loss token after truncation to max_seq_len=4" in proc.stderr
    _assert_one_error_and_no_checkpoint(proc, "lora_dpo_single_device", out, 4)


@pytest.mark.slow
def test_two_ranks_without_loss_tokens_stop_together_with_one_line(tiny_assets, tmp_path):
    out = tmp_path / "run"
    proc = run_distributed(
        "lora_finetune_distributed",
        ASSETS / "lora_tiny.yaml",
        _overrides(tiny_assets, out, "tokenizer.max_seq_len=8", "batch_size=2"),
        cwd=tmp_path,
        check=False,
    )
    _assert_one_error_and_no_checkpoint(proc, "lora_finetune_distributed", out, 8)
