"""One prepared GPU check: the gpu test tier, then tune's recipes against torchtune 0.6.1's on the same GPU.

    make gpu-check                      # on a machine with one CUDA GPU: python3 benchmarks/gpu_check.py --out DIR
    python benchmarks/gpu_check.py --dry --out /tmp/gpu-check     # CPU, tiny shapes: what `make test` runs

Sections, in order, each skipped (and said so in the table) when the time budget (``--budget-s``) cannot hold it:

1. correctness: ``pytest -m gpu tests/gpu`` (bf16 on the GPU against fp32 references, compile, NF4, float8, MoE);
   each comparison's measured difference is collected from ``TUNE_GPU_CHECK_RESULTS``.
2. speed: Llama 3.1 8B shapes on one GPU, randomly initialised (no download), LoRA, full and QLoRA fine-tuning,
   each system from its own shipped config (``llama3_1/8B_{lora,full,qlora}_single_device``) with the same
   changes: batch 2, packed to 2,048 tokens, compile on, bf16, activation checkpointing off, gradient
   accumulation 1, the same alpaca-format data and SentencePiece tokenizer (text tokens are irrelevant to speed),
   full fine-tuning with fused AdamW stepped in the backward pass (``optimizer_in_bwd``; torchtune's config names
   bitsandbytes' paged 8-bit AdamW, which is not installed there).
3. rl: a LoRA DPO step on Llama 3.2 1B shapes, both systems (pairs/s), and a full GRPO step with generation (tune
   only: torchtune 0.6.1 has no single-device GRPO recipe; completions/s).

Definitions. tokens/s: packed positions (batch x 2,048) per second over the steps after ``--warmup`` steps, from
the wall times the shared logger (``benchmarks/gpu_check_components.py``) writes after synchronising the device.
Peak memory: ``torch.cuda.max_memory_allocated`` in the recipe's process at the last step. MFU: model FLOPs per
position (6N for full fine-tuning, 4N for LoRA/QLoRA with N the parameters outside the token embedding, plus
attention's 12 x layers x dim x sequence, torchtitan's convention) x tokens/s over the chip's dense bf16 peak
(``--peak-tflops``, 989 for the H100/H200 SXM by NVIDIA's datasheet); the measured bf16 matmul rate is printed too.

Writes ``OUT/table.md`` and ``OUT/results.json``, and prints the table. Exit status: 1 when a check failed, 2 when
the budget left runs out, else 0.
"""

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
SEQ = 2048

# Hugging Face Llama shapes; the named torchtune/tune builders of the configs have the same
SHAPES = {
    "llama3_1_8b": dict(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336, tied=False),
    "llama3_2_1b": dict(vocab=128256, dim=2048, layers=16, heads=32, kv_heads=8, hidden=8192, tied=True),
    # NF4's double quantisation needs every quantised weight's size to be a multiple of 64 x 256
    "tiny": dict(vocab=512, dim=256, layers=2, heads=4, kv_heads=2, hidden=512, tied=False),
}
MODES = ("lora", "full", "qlora")
FLOPS_PER_PARAM = {"lora": 4, "qlora": 4, "full": 6}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---------------------------------------------------------------------------------------------------- assets


def write_checkpoint(path: Path, shape: dict, dtype_name: str, device: str) -> list[str]:
    """A randomly initialised Hugging Face Llama checkpoint (std 0.02, norms 1): its shard file names."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    head_dim = shape["dim"] // shape["heads"]
    q, kv = shape["heads"] * head_dim, shape["kv_heads"] * head_dim
    names: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape["vocab"], shape["dim"]))]
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        names += [
            (p + "input_layernorm.weight", (shape["dim"],)),
            (p + "self_attn.q_proj.weight", (q, shape["dim"])),
            (p + "self_attn.k_proj.weight", (kv, shape["dim"])),
            (p + "self_attn.v_proj.weight", (kv, shape["dim"])),
            (p + "self_attn.o_proj.weight", (shape["dim"], q)),
            (p + "post_attention_layernorm.weight", (shape["dim"],)),
            (p + "mlp.gate_proj.weight", (shape["hidden"], shape["dim"])),
            (p + "mlp.up_proj.weight", (shape["hidden"], shape["dim"])),
            (p + "mlp.down_proj.weight", (shape["dim"], shape["hidden"])),
        ]
    names.append(("model.norm.weight", (shape["dim"],)))
    if not shape["tied"]:
        names.append(("lm_head.weight", (shape["vocab"], shape["dim"])))
    generator = torch.Generator(device=device).manual_seed(0)
    shards: list[dict] = [{}]
    shard_bytes, limit = 0, 4 * 2**30
    for name, size in names:
        if len(size) == 1:
            tensor = torch.ones(size, dtype=dtype)
        else:
            tensor = torch.empty(size, dtype=dtype, device=device).normal_(0.0, 0.02, generator=generator).cpu()
        nbytes = tensor.numel() * tensor.element_size()
        if shard_bytes + nbytes > limit and shards[-1]:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += nbytes
    files, weight_map = [], {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / file), metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(shard, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape["vocab"],
        "hidden_size": shape["dim"],
        "intermediate_size": shape["hidden"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": head_dim,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0 if shape["dim"] >= 4096 else 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": shape["tied"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16" if dtype_name == "bf16" else "float32",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return files


def write_data(root: Path) -> tuple[Path, Path, Path]:
    """A SentencePiece tokenizer (tests/recipes/utils.py's), alpaca rows long enough to fill many 2,048-token
    packs, preference pairs for DPO and (``prompts.json`` beside them) arithmetic prompts for GRPO: their paths."""
    sys.path.insert(0, str(ROOT))
    from tests.recipes.utils import _WORDS, _train_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = root / "tokenizer.model"
    _train_tokenizer(tokenizer)
    rng = random.Random(0)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    rows = [
        {"instruction": words(rng.randrange(10, 40)), "input": words(rng.randrange(0, 40)), "output": words(80)}
        for _ in range(1500)
    ]
    alpaca = root / "alpaca.json"
    alpaca.write_text(json.dumps(rows))
    pairs = []
    for _ in range(600):
        prompt = words(rng.randrange(40, 120))
        chosen, rejected = words(rng.randrange(60, 160)), words(rng.randrange(60, 160))
        pairs.append(
            {
                "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": chosen}],
                "rejected": [{"role": "user", "content": prompt}, {"role": "assistant", "content": rejected}],
            }
        )
    preference = root / "pairs.json"
    preference.write_text(json.dumps(pairs))
    prompts = [
        {"prompt": f"What is {a} + {b}? {words(20)}", "answer": str(a + b)} for a in range(20) for b in range(10)
    ]
    (root / "prompts.json").write_text(json.dumps(prompts))
    return tokenizer, alpaca, preference


# ---------------------------------------------------------------------------------------------------- configs


def shipped_config(system: str, name: str, torchtune_wheel: Path | None):
    """The system's own shipped config ``name`` (e.g. ``llama3_1/8B_lora_single_device``) as an OmegaConf node."""
    from omegaconf import OmegaConf

    if system == "tune":
        return OmegaConf.load(ROOT / "configs" / f"{name}.yaml")
    with zipfile.ZipFile(torchtune_wheel) as wheel:
        return OmegaConf.create(wheel.read(f"recipes/configs/{name}.yaml").decode())


def tiny_model(prefix: str, mode: str, shape: dict) -> dict:
    """The dry run's model: the family's generic builder at the tiny shape (the named 8B builders take no sizes)."""
    sizes = dict(
        vocab_size=shape["vocab"],
        num_layers=shape["layers"],
        num_heads=shape["heads"],
        num_kv_heads=shape["kv_heads"],
        embed_dim=shape["dim"],
        intermediate_dim=shape["hidden"],
        max_seq_len=SEQ,
    )
    if mode == "full":
        return {"_component_": f"{prefix}.models.llama3_1.llama3_1", **sizes}
    lora = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, lora_rank=8)
    model = {"_component_": f"{prefix}.models.llama3_1.lora_llama3_1", **sizes, **lora, "lora_alpha": 16}
    if mode == "qlora":
        model["quantize_base"] = True
    return model


def common_changes(system: str, args, assets: dict, checkpoint: str, out: Path, steps: int) -> dict:
    """What both systems' configs get in every run: data, tokenizer, checkpoint, logging, precision."""
    prefix = "tune" if system == "tune" else "torchtune"
    return {
        "output_dir": str(out),
        "tokenizer": {
            "_component_": f"{prefix}.models.llama2.llama2_tokenizer",
            "path": str(assets["tokenizer"]),
            "max_seq_len": SEQ,
            "prompt_template": None,
        },
        "checkpointer.checkpoint_dir": str(assets[checkpoint]),
        "checkpointer.checkpoint_files": assets[checkpoint + "_files"],
        "checkpointer.model_type": "LLAMA3_2" if checkpoint == "llama3_2_1b" else "LLAMA3",
        "seed": 0,
        "shuffle": True,
        "epochs": 1,
        "max_steps_per_epoch": steps,
        "gradient_accumulation_steps": 1,
        "clip_grad_norm": None,
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "metric_logger": {
            "_component_": "gpu_check_components.TimedLogger",
            "log_dir": str(out / "logs"),
            "stop_after": steps,
        },
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "device": args.device,
        "dtype": "fp32" if args.dry else "bf16",
    }


def apply(cfg, changes: dict):
    from omegaconf import OmegaConf

    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


def speed_config(system: str, mode: str, args, assets: dict, out: Path, steps: int, dense: bool = False):
    """``dense``: tune's model keeps the dense masked SDPA call for packed batches instead of flex attention."""
    prefix = "tune" if system == "tune" else "torchtune"
    cfg = shipped_config(system, f"llama3_1/8B_{mode}_single_device", args.torchtune_wheel)
    changes = common_changes(system, args, assets, "llama3_1_8b", out, steps)
    changes["dataset"] = {
        "_component_": f"{prefix}.datasets.alpaca_dataset",
        "source": "json",
        "data_files": str(assets["alpaca"]),
        "split": "train",
        "train_on_input": True,
        "packed": True,
    }
    changes.update(batch_size=2, compile=not args.dry)
    if mode == "full":  # torchtune's full config has no LR schedule: neither run gets one
        changes["optimizer"] = {"_component_": "torch.optim.AdamW", "fused": True, "lr": 2e-5, "weight_decay": 0.01}
        changes["optimizer_in_bwd"] = True
        cfg.pop("lr_scheduler", None)
    else:
        changes["lr_scheduler.num_warmup_steps"] = 0
    if args.dry:
        changes["model"] = tiny_model(prefix, mode, SHAPES["tiny"])
    cfg = apply(cfg, changes)
    if dense:
        model = {k: v for k, v in cfg.model.items() if k != "_component_"}
        model = {"_component_": "gpu_check_components.dense_attention_model", "builder": cfg.model._component_, **model}
        cfg = apply(cfg, {"model": model})
    return cfg


def dpo_config(system: str, args, assets: dict, out: Path, steps: int):
    """LoRA DPO on Llama 3.2 1B shapes: each system's 8B LoRA DPO config with the 1B model builder swapped in."""
    prefix = "tune" if system == "tune" else "torchtune"
    cfg = shipped_config(system, "llama3_1/8B_lora_dpo_single_device", args.torchtune_wheel)
    changes = common_changes(system, args, assets, "llama3_2_1b", out, steps)
    changes["tokenizer"]["max_seq_len"] = 1024
    changes["dataset"] = {
        "_component_": f"{prefix}.datasets.preference_dataset",
        "source": "json",
        "data_files": str(assets["pairs"]),
        "split": "train",
    }
    changes.update(batch_size=4, compile=False)
    changes["lr_scheduler.num_warmup_steps"] = 0
    if args.dry:
        changes["model"] = tiny_model(prefix, "lora", SHAPES["tiny"])
    else:
        lora = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, lora_rank=8)
        changes["model"] = {"_component_": f"{prefix}.models.llama3_2.lora_llama3_2_1b", **lora, "lora_alpha": 16}
    return apply(cfg, changes)


# ---------------------------------------------------------------------------------------------------- runs


def run_system(system: str, recipe: str, cfg, run_dir: Path, args, timeout: float) -> dict:
    """Runs one recipe of one system in its own process; returns its logged steps and exit status."""
    from omegaconf import OmegaConf

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = run_dir / "config.yaml"
    OmegaConf.save(cfg, config)
    module = "torchtune._cli.tune" if system == "torchtune" else "tune._cli.main"
    paths = [str(BENCH), str(ROOT) if system != "torchtune" else "", os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(run_dir / "hf_home"))
    command = [args.python, "-m", module, "run", recipe, "--config", str(config)]
    started = time.time()
    log = run_dir / "output.log"
    try:
        with open(log, "w") as out:
            proc = subprocess.run(command, cwd=run_dir, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    steps_file = Path(cfg.output_dir) / "logs" / "steps.jsonl"
    records = [json.loads(line) for line in steps_file.read_text().splitlines()] if steps_file.exists() else []
    steps = [r for r in records if "loss" in r]
    result = {"system": system, "status": status, "steps": steps, "wall_s": time.time() - started}
    if status != 0 or not steps:
        result["tail"] = log.read_text()[-2500:]
    return result


def _no_result(result: dict) -> str:
    """The table's word for a run without a measurement: skipped for the time budget, or FAILED with its status."""
    status = str(result["status"])
    return status if status.startswith("not run") else f"FAILED ({status})"


def throughput(result: dict, batch_size: int, warmup: int) -> float | None:
    steps = [s for s in result["steps"] if s["step"] >= warmup]
    if len(steps) < 2:
        return None
    return batch_size * SEQ * (len(steps) - 1) / (steps[-1]["time"] - steps[0]["time"])


def model_flops_per_token(shape: dict, mode: str) -> float:
    head_dim = shape["dim"] // shape["heads"]
    per_layer = (
        shape["dim"] * head_dim * (2 * shape["heads"] + 2 * shape["kv_heads"]) + 3 * shape["dim"] * shape["hidden"]
    )
    params = shape["layers"] * per_layer + shape["vocab"] * shape["dim"]  # the output projection, not the embedding
    return FLOPS_PER_PARAM[mode] * params + 12 * shape["layers"] * shape["dim"] * SEQ


def prepare_assets(args, work: Path, sections: list[str], results: dict) -> dict:
    started = time.monotonic()
    assets: dict = {}
    assets["tokenizer"], assets["alpaca"], assets["pairs"] = write_data(work / "data")
    dtype = "fp32" if args.dry else "bf16"
    wanted = {"speed": "llama3_1_8b", "rl": "llama3_2_1b"}
    for section, name in wanted.items():
        if section in sections:
            shape = SHAPES["tiny" if args.dry else name]
            assets[name] = work / name
            assets[name + "_files"] = write_checkpoint(assets[name], shape, dtype, args.device)
    results["assets_s"] = time.monotonic() - started
    print(f"[assets] written in {results['assets_s']:.0f} s", flush=True)
    return assets


def run_pairs(args, budget: Budget, runs: list[tuple[str, str, str, object]], work: Path, fallback=None) -> list[dict]:
    """Runs (label, system, recipe, config builder) in order while the budget lasts; a skipped run says so.
    ``fallback(label, system)`` may give a run to try at once in place of a failed one (or None)."""
    estimate, out, runs = 0.0, [], list(runs)
    while runs:
        label, system, recipe, build = runs.pop(0)
        if budget.left() < max(estimate, 20.0) + args.reserve_s:
            out.append({"label": label, "system": system, "status": "not run: time budget", "steps": []})
            continue
        run_dir = work / "runs" / f"{system}_{label.replace(' ', '_')}"
        cfg = build(out=run_dir / "out")
        t0 = time.monotonic()
        result = run_system(system, recipe, cfg, run_dir, args, timeout=min(args.run_timeout, budget.left()))
        estimate = max(estimate, time.monotonic() - t0)
        result["label"] = label
        out.append(result)
        print(
            f"[run] {label} {system}: status {result['status']}, {len(result['steps'])} steps, "
            f"{result['wall_s']:.0f} s",
            flush=True,
        )
        if result.get("tail"):
            print(result["tail"], file=sys.stderr, flush=True)
    return out


def section_speed(args, budget: Budget, work: Path, assets: dict, rows: list, results: dict) -> None:
    shape = SHAPES["tiny" if args.dry else "llama3_1_8b"]
    steps = 4 if args.dry else args.steps
    systems = ["torchtune", "tune"] if args.torchtune_wheel else ["tune"]
    runs = []
    for mode in args.modes:
        recipe = "full_finetune_single_device" if mode == "full" else "lora_finetune_single_device"
        for system in systems:
            if system == "torchtune" and args.torchtune_modes is not None and mode not in args.torchtune_modes:
                continue
            build = functools.partial(speed_config, system, mode, args, assets, steps=steps)
            runs.append((f"8B {mode}", system, recipe, build))
            if system == "tune" and mode in args.dense_modes:
                build = functools.partial(speed_config, system, mode, args, assets, steps=steps, dense=True)
                runs.append((f"8B {mode}", "tune-dense-sdpa", recipe, build))

    def fallback(label: str, system: str):  # a failed flex-attention run: measure the dense path instead
        mode = label.split()[1]
        if system != "tune" or mode in args.dense_modes:
            return None
        recipe = "full_finetune_single_device" if mode == "full" else "lora_finetune_single_device"
        build = functools.partial(speed_config, system, mode, args, assets, steps=steps, dense=True)
        return (label, "tune-dense-sdpa", recipe, build)

    size = "tiny" if args.dry else "8B"
    for result in run_pairs(args, budget, runs, work, fallback):
        mode = result["label"].split()[1]
        tps = throughput(result, 2, args.warmup)
        result["tokens_per_s"] = tps
        results.setdefault("speed", []).append(result)
        label = f"{size} {mode}, batch 2 x {SEQ} packed, compile"
        if tps is None:
            rows.append(("speed", label, result["system"], _no_result(result), "", "", ""))
            continue
        peak = result["steps"][-1].get("peak_alloc_gib")
        mfu = model_flops_per_token(shape, mode) * tps / (args.peak_tflops * 1e12)
        losses = f"{result['steps'][0]['loss']:.4f} -> {result['steps'][-1]['loss']:.4f}"
        peak_text = f"{peak:.1f}" if peak else "-"
        rows.append(("speed", label, result["system"], f"{tps:,.0f}", peak_text, f"{mfu:.1%}", losses))


GRPO_PROMPTS, GRPO_SAMPLES, GRPO_TOKENS = 4, 8, 256


def grpo_config(args, assets: dict, out: Path, steps: int):
    """Full GRPO on Llama 3.2 1B shapes, tune's shipped config: 4 prompts x 8 completions of up to 256 tokens per
    step, all 32 generated in one batch. A random model rarely samples EOS, so completions run to the limit."""
    cfg = shipped_config("tune", "llama3_2/1B_full_grpo_single_device", None)
    changes = common_changes("tune", args, assets, "llama3_2_1b", out, steps)
    changes["tokenizer"]["max_seq_len"] = 1024
    changes["dataset"] = {
        "_component_": "tune.datasets.prompt_dataset",
        "source": "json",
        "data_files": str(assets["alpaca"].parent / "prompts.json"),
        "split": "train",
    }
    changes.update(batch_size=GRPO_PROMPTS, grpo_samples=GRPO_SAMPLES, forward_batch_size=GRPO_PROMPTS * GRPO_SAMPLES)
    changes.update(max_generated_tokens=GRPO_TOKENS if not args.dry else 16, clip_grad_norm=1.0)
    changes["lr_scheduler.num_warmup_steps"] = 0
    if args.dry:
        changes["model"] = tiny_model("tune", "full", SHAPES["tiny"])
    return apply(cfg, changes)


def sampling_row(args, budget: Budget, work: Path, rows: list, results: dict) -> None:
    """What GRPO's and PPO's rollouts spend their steps in: ``bench_generate.py``, 32 rows x 128 new tokens."""
    size, new_tokens = ("tiny", 16) if args.dry else ("1B", 128)
    label = f"{size} sampling, 32 rows x {new_tokens} new tokens, KV cache, eager"
    if budget.left() < 60 + args.reserve_s:
        rows.append(("rl", label, "tune", "not run: time budget", "", "", ""))
        return
    out = work / "sampling.json"
    command = [args.python, str(BENCH / "bench_generate.py"), "--device", args.device, "--json", str(out)]
    command += ["--new-tokens", str(new_tokens)] + (["--tiny"] if args.dry else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=min(120, budget.left()), env=env, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        rows.append(("rl", label, "tune", f"failed (status {proc.returncode})", "", "", ""))
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr, flush=True)
        return
    measured = json.loads(out.read_text())
    results["sampling"] = measured
    rate = measured["rows"][0]["tokens_per_s"]
    rows.append(("rl", label, "tune", f"{rate:,.0f} new tokens/s", "", "", "torchtune 0.6.1: not measured"))


def section_rl(args, budget: Budget, work: Path, assets: dict, rows: list, results: dict) -> None:
    steps = 4 if args.dry else args.steps
    systems = ["torchtune", "tune"] if args.torchtune_wheel else ["tune"]
    runs = []
    if "dpo" in args.rl_runs:
        for system in systems:
            dpo = functools.partial(dpo_config, system, args, assets, steps=steps)
            runs.append(("1B dpo", system, "lora_dpo_single_device", dpo))
    if "grpo" in args.rl_runs:
        grpo_steps = 3 if not args.dry else 2
        grpo = functools.partial(grpo_config, args, assets, steps=grpo_steps)
        runs.append(("1B grpo", "tune", "grpo_full_finetune_single_device", grpo))
    if "sampling" in args.rl_runs:
        sampling_row(args, budget, work, rows, results)
    for result in run_pairs(args, budget, runs, work):
        results.setdefault("rl", []).append(result)
        if result["label"] == "1B grpo":
            steps_logged = [s for s in result["steps"] if s["step"] >= 1]
            size = "tiny" if args.dry else "1B"
            tokens = 16 if args.dry else GRPO_TOKENS
            label = f"{size} full GRPO, {GRPO_PROMPTS} prompts x {GRPO_SAMPLES} completions <= {tokens} tokens"
            if len(steps_logged) < 2:
                rows.append(
                    (
                        "rl",
                        label,
                        "tune",
                        _no_result(result),
                        "",
                        "",
                        "torchtune 0.6.1 has no single-device GRPO",
                    )
                )
                continue
            per_s = (
                GRPO_PROMPTS
                * GRPO_SAMPLES
                * (len(steps_logged) - 1)
                / (steps_logged[-1]["time"] - steps_logged[0]["time"])
            )
            result["completions_per_s"] = per_s
            peak = result["steps"][-1].get("peak_alloc_gib")
            rows.append(
                (
                    "rl",
                    label,
                    "tune",
                    f"{per_s:.1f} completions/s",
                    f"{peak:.1f}" if peak else "-",
                    "",
                    "torchtune 0.6.1 has no single-device GRPO",
                )
            )
            continue
        steps_after = [s for s in result["steps"] if s["step"] >= args.warmup]
        label = f"{'tiny' if args.dry else '1B'} LoRA DPO, 4 pairs/step, seq <= 1024"
        if len(steps_after) < 2:
            rows.append(("rl", label, result["system"], _no_result(result), "", "", ""))
            continue
        pairs = 4 * (len(steps_after) - 1) / (steps_after[-1]["time"] - steps_after[0]["time"])
        result["pairs_per_s"] = pairs
        peak = result["steps"][-1].get("peak_alloc_gib")
        losses = f"{result['steps'][0]['loss']:.4f} -> {result['steps'][-1]['loss']:.4f}"
        peak_text = f"{peak:.1f}" if peak else "-"
        rows.append(("rl", label, result["system"], f"{pairs:.2f} pairs/s", peak_text, "", losses))


def start_correctness(args, budget: Budget, work: Path) -> dict:
    """Starts the gpu tier in the background (it overlaps the speed section's checkpoint writing)."""
    record = work / "gpu_tier.jsonl"
    record.unlink(missing_ok=True)
    env = {
        **os.environ,
        "TUNE_GPU_CHECK_RESULTS": str(record),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [args.python, "-m", "pytest", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider", "-q", "-rfEs"]
    command += ["--junitxml", str(work / "gpu_tier.xml")]
    if args.dry:  # the wiring only: one comparison, run on CPU
        env["TUNE_GPU_TIER_DEVICE"] = "cpu"
        command += ["-k", "bf16_training_tracks_fp32"]
    else:
        command += ["-n", str(args.workers)]
    if args.tier_k:
        command += ["-k", args.tier_k]
    log = open(work / "gpu_tier.log", "w")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"proc": proc, "log": log, "record": record, "started": time.monotonic(), "path": work / "gpu_tier.log"}


def finish_correctness(running: dict, args, budget: Budget, rows: list, results: dict) -> None:
    timeout = max(
        10.0, min(args.correctness_s - (time.monotonic() - running["started"]), budget.left() - args.reserve_s)
    )
    try:
        status = running["proc"].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        running["proc"].kill()
        status = "timeout"
    running["log"].close()
    output = running["path"].read_text().strip().splitlines()
    summary = output[-1] if output and status != "timeout" else f"timed out after {args.correctness_s:.0f} s"
    results["correctness"] = {
        "status": status,
        "summary": summary,
        "wall_s": time.monotonic() - running["started"],
        "failures": [line for line in output if line.startswith(("FAILED", "ERROR", "SKIPPED"))],
    }
    rows.append(("correctness", "pytest -m gpu tests/gpu", "tune", summary, "", "", ""))
    if running["record"].exists():
        for line in running["record"].read_text().splitlines():
            r = json.loads(line)
            results.setdefault("comparisons", []).append(r)
            verdict = "pass" if r.get("passed") else "FAIL"
            diff = f"max abs {r.get('max_abs', float('nan')):.2e}, rel {r.get('max_rel', float('nan')):.2e}"
            rows.append(("correctness", r["test"], r.get("compared", ""), verdict, diff, r.get("tolerance", ""), ""))
    print(f"[correctness] {summary}", flush=True)


def matmul_tflops(device: str) -> float | None:
    import torch

    if device != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12


def describe(device: str) -> dict:
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("torchtune", "torchao", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as error:  # not installed, or fails to import: say which
            info[name] = f"unavailable ({type(error).__name__})"
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["bf16_matmul_tflops"] = round(matmul_tflops(device), 1)
    return info


def table(environment: dict, rows: list[tuple]) -> str:
    header = ("section", "check", "system", "result", "peak GiB / difference", "MFU / tolerance", "loss first -> last")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join([f"environment: {json.dumps(environment)}", "", *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry", action="store_true", help="CPU, tiny shapes, fp32, compile off: the wiring only")
    parser.add_argument("--sections", default="correctness,speed,rl")
    parser.add_argument("--work", type=Path, default=None, help="checkpoints and runs (default OUT/work)")
    parser.add_argument("--modes", default=",".join(MODES), type=lambda s: s.split(","))
    parser.add_argument(
        "--rl-runs", default="sampling,dpo,grpo", type=lambda s: s.split(","), help="of sampling, dpo, grpo"
    )
    parser.add_argument("--tier-k", default=None, help="pytest -k expression selecting part of the gpu tier")
    parser.add_argument(
        "--torchtune-modes",
        default=None,
        type=lambda s: s.split(","),
        help="modes torchtune runs too (default: all); e.g. to rerun tune alone after a fix",
    )
    parser.add_argument(
        "--dense-modes",
        default=[],
        type=lambda s: s.split(","),
        help="modes also run with tune's dense masked SDPA instead of flex attention (e.g. lora)",
    )
    parser.add_argument("--budget-s", type=float, default=510.0, help="the whole check's wall-clock budget")
    parser.add_argument("--reserve-s", type=float, default=10.0, help="kept back for writing the table")
    parser.add_argument("--correctness-s", type=float, default=150.0)
    parser.add_argument("--run-timeout", type=float, default=240.0, help="one recipe run's limit")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s (compile, allocator)")
    parser.add_argument("--workers", type=int, default=4, help="pytest-xdist workers for the gpu tier")
    parser.add_argument("--torchtune-wheel", type=Path, default=None, help="torchtune 0.6.1's wheel (its configs)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    args.device = "cpu" if args.dry else "cuda"
    budget = Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"environment": describe(args.device), "args": {k: str(v) for k, v in vars(args).items()}}
    print(json.dumps(results["environment"]), flush=True)
    rows: list[tuple] = []
    sections = args.sections.split(",")

    def save() -> None:  # after each section: a check stopped by its caller keeps what it measured
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "table.md").write_text(table(results["environment"], rows) + "\n")

    running = start_correctness(args, budget, work) if "correctness" in sections else None
    assets = None
    if {"speed", "rl"} & set(sections):
        try:
            assets = prepare_assets(args, work, sections, results)
        except Exception as error:  # the correctness section still reports
            rows.append(("assets", "checkpoints and data", "", f"FAILED: {type(error).__name__}: {error}", "", "", ""))
    if running is not None:
        finish_correctness(running, args, budget, rows, results)
        save()
    for name, section in (("speed", section_speed), ("rl", section_rl)):
        if name not in sections or assets is None:
            continue
        try:
            section(args, budget, work, assets, rows, results)
        except Exception as error:  # one broken section must not cost the others' results
            rows.append((name, "section", "", f"FAILED: {type(error).__name__}: {error}", "", "", ""))
            print(f"[{name}] failed: {error!r}", file=sys.stderr, flush=True)
        save()
    print(table(results["environment"], rows))
    failed = any("FAIL" in str(row[3]) or "FAIL" in str(row[4]) for row in rows)
    incomplete = any(str(row[3]).startswith("not run") for row in rows)
    sys.exit(1 if failed else 2 if incomplete else 0)  # 2: the budget left runs out (the table lists them)


if __name__ == "__main__":
    main()
