"""`tune estimate` and `tune validate --estimate`: shipped configs on the meta device, errors, and real CPU runs whose
peak RSS the estimate must match within 15% (benchmarks/bench_estimate.py runs more of them)."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_estimate", REPO / "benchmarks" / "bench_estimate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_estimate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench_estimate = _bench_module()


def test_estimate_a_70b_config_in_seconds_without_weights(tune):
    # the config's checkpoint_dir (/tmp/Meta-Llama-3.1-70B-Instruct) does not exist here: nothing is read
    start = time.perf_counter()
    code, out, err = tune("estimate", "llama3_1/70B_full", "--nproc_per_node", "8", "--device-memory", "80GiB")
    seconds = time.perf_counter() - start
    assert code == 0, err
    assert seconds < 30
    assert "70.55B parameters" in out and "8 devices" in out
    assert "peak per device" in out and "fits in 80.00 GiB" in out


def test_json_holds_the_terms_and_their_sum(tune):
    code, out, _ = tune("estimate", "llama3_2/1B_lora_single_device", "--device-memory", "80GiB", "--json")
    assert code == 0
    report = json.loads(out)
    estimate = report["estimate"]
    assert report["recipe"] == "lora_finetune_single_device" and report["method"] == "LoRA SFT"
    assert estimate["peak"] == sum(estimate["terms"].values())
    assert estimate["fits"] is True and report["suggestions"] == []
    assert estimate["num_trainable"] < estimate["num_params"] / 10  # only the adapters train


def test_overrides_change_the_estimate(tune):
    def peak(*overrides):
        code, out, _ = tune("estimate", "llama3_2/1B_lora_single_device", "--json", "--device-memory", "80", *overrides)
        assert code == 0
        return json.loads(out)["estimate"]["terms"]["activations"]

    assert peak("batch_size=2") < peak("batch_size=4")
    assert peak("enable_activation_checkpointing=True") < peak()


def test_suggests_what_makes_it_fit(tune):
    code, out, _ = tune("estimate", "llama3_1/8B_full_single_device", "--device-memory", "24GiB", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["estimate"]["fits"] is False
    suggestions = report["suggestions"]
    assert suggestions and suggestions[-1]["fits"] is True
    assert all(not s["fits"] for s in suggestions[:-1])  # tried in order, stopped at the first that fits
    assert "lora_llama3_1_8b" in suggestions[-1]["change"]
    code, out, _ = tune("estimate", "llama3_1/8B_full_single_device", "--device-memory", "24GiB")
    assert "does NOT fit" in out and "to make it fit" in out


def test_more_ranks_for_a_distributed_recipe(tune):
    code, out, _ = tune("estimate", "llama3_1/8B_lora", "--device-memory", "4GiB", "--json")
    report = json.loads(out)
    assert report["estimate"]["fits"] is False
    changes = [s["change"] for s in report["suggestions"]]
    assert any("qlora_llama3_1_8b" in c for c in changes)  # cheaper than more ranks: tried first
    assert "--nproc_per_node" in changes[-1] and report["suggestions"][-1]["fits"]
    one = report["estimate"]["terms"]["weights"]
    code, out, _ = tune("estimate", "llama3_1/8B_lora", "--nproc_per_node", "4", "--json")
    assert json.loads(out)["estimate"]["terms"]["weights"] == pytest.approx(one / 4, rel=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["llama3_2/1B_full_single_device", "batch_size=x"], "batch_size = 'x': must be a positive integer"),
        (["llama3_2/1B_full_single_device", "enable_activation_checkpointing=3"], "must be true or false"),
        (["llama3_2/1B_full_single_device", "model._component_=tune.models.nope"], "model._component_"),
        (["no/such_config"], "unknown config"),
        (["llama3_2/1B_full_single_device", "--device-memory", "lots"], "is not a size"),
        (["llama3_2/1B_full_single_device", "--nproc_per_node", "2"], "runs on one device"),
    ],
)
def test_a_bad_config_or_option_is_one_line(tune, args, message):
    code, out, err = tune("estimate", *args)
    assert code == 1
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_every_flag_is_documented_with_an_example(tune):
    code, out, _ = tune("estimate", "--help")
    assert code == 0 and "examples:" in out
    for flag in ("--nproc_per_node", "--nnodes", "--device-memory", "--no-baseline", "--json", "--recipe"):
        assert flag in out
    assert out.count("e.g.") >= 7


def test_validate_estimate(tune):
    code, out, _ = tune("validate", "llama3_2/1B_full_single_device", "--estimate", "--device-memory", "24GiB")
    assert code == 0
    assert "is valid" in out and "peak per device" in out and "fits in 24.00 GiB" in out


# ------------------------------------------------------------------------------------------- real CPU runs


@pytest.fixture(scope="module")
def bench_assets(tmp_path_factory):
    return bench_estimate.make_assets(tmp_path_factory.mktemp("estimate") / "assets")


def _check(case, bench_assets, tmp_path):
    result = bench_estimate.run_case(case, tmp_path, bench_assets)
    print(bench_estimate.table([result]))
    assert abs(result.error_pct) <= 15, bench_estimate.table([result])


_QUICK = [c for c in bench_estimate.CASES if c.name.startswith("tiny-")]


@pytest.mark.parametrize("case", _QUICK, ids=[c.name for c in _QUICK])
def test_estimate_matches_a_real_cpu_run(case, bench_assets, tmp_path):
    if case.method == "qlora":
        pytest.importorskip("torchao")
    _check(case, bench_assets, tmp_path)


_SLOW = [c for c in bench_estimate.CASES if not c.name.startswith("tiny-")]


@pytest.mark.slow
@pytest.mark.parametrize("case", _SLOW, ids=[c.name for c in _SLOW])
def test_estimate_matches_a_larger_cpu_run(case, bench_assets, tmp_path):
    if case.method == "qlora":
        pytest.importorskip("torchao")
    _check(case, bench_assets, tmp_path)
