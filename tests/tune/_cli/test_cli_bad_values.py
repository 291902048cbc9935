"""Bad values through `tune validate` and `tune run` (tune/_cli/_run.py, tune/config/_validate.py): one line each,
exit status 1, no traceback, refused before the recipe starts (nothing is built or loaded; distributed runs are
refused before torchrun starts a process)."""

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "tests" / "recipes" / "assets" / "full_tiny.yaml"
FULL = "full_finetune_single_device"

# (override, the text of the one problem); each passed `tune validate` and crashed or trained in `tune run` before
BAD_VALUES = [
    ("dtype=bfloat32", "dtype = 'bfloat32': must be one of fp32, bf16, fp16, fp64"),
    ("batch_size=0", "batch_size = 0: must be an integer >= 1"),
    ("optimizer.lr=-0.001", "optimizer.lr = -0.001: must be a learning rate >= 0"),
    ("optimizer.lr=fast", "optimizer.lr = 'fast': must be a number or Tensor (argument 'lr' of torch.optim.AdamW)"),
    ("model.num_layers=two", "model.num_layers = 'two': must be an integer (argument 'num_layers' of"),
    ("device=gpu", "device = 'gpu': must be one of cpu, cuda, cuda:N (a GPU index), mps, xpu, npu, or auto"),
    (
        "dataset.sorce=tatsu-lab/alpaca",
        "dataset.sorce = 'tatsu-lab/alpaca': is not an option of tune.datasets.alpaca_dataset nor of "
        "datasets.load_dataset('json'); did you mean source?",
    ),
    ("dataset.packed=maybe", "dataset.packed = 'maybe': must be true or false (argument 'packed' of"),
]


def _overrides(tmp_path: Path) -> list[str]:
    return [f"assets_dir={tmp_path / 'assets'}", f"output_dir={tmp_path / 'out'}"]


@pytest.mark.parametrize("override, expected", BAD_VALUES, ids=[o.split("=")[0] for o, _ in BAD_VALUES])
def test_validate_reports_the_bad_value(tune, tmp_path, override, expected):
    code, out, err = tune("validate", str(CONFIG), "--recipe", FULL, *_overrides(tmp_path), override)
    assert code == 1, out + err
    assert f"1 problem for recipe {FULL}:\n  - {expected}" in out, out
    assert "Traceback" not in err


@pytest.mark.parametrize("override, expected", BAD_VALUES, ids=[o.split("=")[0] for o, _ in BAD_VALUES])
def test_run_refuses_the_bad_value_before_the_recipe_starts(tune, tmp_path, override, expected):
    code, out, err = tune("run", FULL, "--config", str(CONFIG), *_overrides(tmp_path), override)
    assert code == 1, out + err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"tune: error: {CONFIG}: {expected}"), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # the recipe never started: nothing written


def test_a_lora_builders_arguments_are_checked_too(tune, tmp_path):
    """The LoRA builders are made by a decorator (tune.models._common.lora_builder): their parameters, lora_rank
    among them, exist in the signature it writes, which the checks read."""
    config, recipe = REPO / "tests" / "recipes" / "assets" / "lora_tiny.yaml", "lora_finetune_single_device"
    expected = "model.lora_rank = 'eight': must be an integer (argument 'lora_rank' of tune.models.llama2.lora_llama2)"
    code, out, err = tune("validate", str(config), "--recipe", recipe, *_overrides(tmp_path), "model.lora_rank=eight")
    assert code == 1 and f"1 problem for recipe {recipe}:\n  - {expected}" in out, out + err
    code, out, err = tune("run", recipe, "--config", str(config), *_overrides(tmp_path), "model.lora_rank=eight")
    assert code == 1 and err.strip() == f"tune: error: {config}: {expected}; got a string", err
    assert not (tmp_path / "out").exists()


def test_all_problems_are_reported_at_once(tune, tmp_path):
    bad = [o for o, _ in BAD_VALUES if not o.startswith("optimizer.lr=-")]
    code, _, err = tune("run", FULL, "--config", str(CONFIG), *_overrides(tmp_path), *bad)
    assert code == 1
    assert f"{len(bad)} problems in the config:" in err
    for _, expected in BAD_VALUES[1:2] + BAD_VALUES[3:]:
        assert expected in err


def _missing_cuda() -> tuple[str, str]:
    # on a machine with GPUs, an index past the last one is the same mistake
    if not torch.cuda.is_available():
        return "device=cuda", "device = 'cuda': no CUDA device is visible on this machine"
    count = torch.cuda.device_count()
    return f"device=cuda:{count}", f"only {count} CUDA device(s) are visible on this machine"


def test_run_refuses_a_device_this_machine_lacks_and_validate_notes_it(tune, tmp_path):
    override, expected = _missing_cuda()
    code, _, err = tune("run", FULL, "--config", str(CONFIG), *_overrides(tmp_path), override)
    assert code == 1 and expected in err and "set device=cpu" in err, err
    assert len(err.strip().splitlines()) == 1, err
    # validate: a config may be meant for another machine; valid, with a note
    code, out, err = tune("validate", str(CONFIG), "--recipe", FULL, *_overrides(tmp_path), override)
    assert code == 0 and out.startswith("OK:"), out + err
    assert expected.split(": ", 1)[1] in err and "`tune run` refuses it on this machine" in err


def test_a_shard_left_out_of_checkpoint_files(tune, tmp_path):
    checkpoint = tmp_path / "assets" / "llama"
    checkpoint.mkdir(parents=True)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"metadata": {}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    override = f"checkpointer.checkpoint_files=[{shards[0]}]"
    expected = (
        f"checkpointer.checkpoint_files = ['{shards[0]}']: misses 1 shard(s) that "
        f"{checkpoint / 'model.safetensors.index.json'} names: {shards[1]}; list every shard, or remove "
        "checkpoint_files to read them from the index"
    )
    for command in (("validate", str(CONFIG), "--recipe", FULL), ("run", FULL, "--config", str(CONFIG))):
        code, out, err = tune(*command, *_overrides(tmp_path), override)
        assert code == 1 and expected in out + err, out + err
    # every shard listed: no problem
    every = f"checkpointer.checkpoint_files=[{','.join(shards)}]"
    code, out, err = tune("validate", str(CONFIG), "--recipe", FULL, *_overrides(tmp_path), every)
    assert code == 0, out + err


def test_a_distributed_run_is_refused_before_torchrun_starts(tune, tmp_path):
    # the launching process checks the config: one line, no rank started, no torchrun failure report
    args = ("run", "--nproc_per_node", "2", "--standalone", "full_finetune_distributed", "--config", str(CONFIG))
    code, out, err = tune(*args, *_overrides(tmp_path), "dtype=bfloat32")
    assert code == 1, out + err
    expected = f"tune: error: {CONFIG}: {BAD_VALUES[0][1]} (or float32, bfloat16, float16, float64)"
    assert err.strip().splitlines() == [expected], err


def test_bf16_on_a_cpu_without_native_bf16_is_detected_from_the_cpu_flags():
    from tune.utils import cpu_has_native_bf16

    assert not cpu_has_native_bf16("processor : 0\nflags : fpu avx2 avx512f avx512bw avx512_vnni\n")
    assert cpu_has_native_bf16("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16("processor : 0\nflags : fpu amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16("processor : 0\nFeatures : fp asimd bf16\n")  # Arm
    assert cpu_has_native_bf16("")  # cannot tell: no warning


def test_show_defaults_resolves_interpolations_of_the_profiler_section(tune, tmp_path):
    # `output_dir: ${output_dir}/profiling_outputs` in the profiler node crashed --show-defaults after "OK"
    config = tmp_path / "prof.yaml"
    text = CONFIG.read_text().replace("  enabled: False\n", "  enabled: False\n  output_dir: ${output_dir}/prof\n")
    config.write_text(text)
    code, out, err = tune("validate", str(config), "--recipe", FULL, *_overrides(tmp_path), "--show-defaults")
    assert code == 0, out + err
    assert f"output_dir: {tmp_path / 'out'}/prof  # config" in out, out


def test_a_rank_error_is_one_line_naming_the_first_rank_that_failed(tmp_path):
    # what torchrun hands the launcher: the error file a failed rank wrote (tune.config.parse writes this layout)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from tune._cli._run import _first_failure

    said = "ConfigError: tokenizer.path: SentencePiece model not found at '/x.model'"
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": said, "extraInfo": {"timestamp": "1"}}}))
    recorded = ProcessFailure(local_rank=1, pid=11, exitcode=1, error_file=str(error_file))
    silent = ProcessFailure(local_rank=0, pid=10, exitcode=1, error_file=str(tmp_path / "none.json"))
    assert _first_failure(ChildFailedError("recipe", {1: recorded})) == (
        "rank 1 failed: tokenizer.path: SentencePiece model not found at '/x.model'"
    )
    assert _first_failure(ChildFailedError("recipe", {0: silent})) == (
        "rank 0 failed (exit status 1); its output above says why"
    )


def test_bf16_on_a_cpu_that_emulates_it_is_warned_once_with_the_fix(tmp_path, monkeypatch, capsys):
    from tune._cli._run import check_before_start
    from tune.utils import _device

    monkeypatch.setattr(_device, "cpu_has_native_bf16", lambda cpuinfo=None: False)  # the CPU of the warning
    check_before_start(["--config", str(CONFIG), *_overrides(tmp_path), "dtype=bf16"])
    err = capsys.readouterr().err
    assert err.count("tune: warning: dtype=bf16 on a CPU without native bfloat16") == 1, err
    assert "Set dtype=fp32 to train faster on this CPU." in err
    check_before_start(["--config", str(CONFIG), *_overrides(tmp_path), "dtype=fp32"])
    assert capsys.readouterr().err == ""
