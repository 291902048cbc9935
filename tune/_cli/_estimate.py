"""``tune estimate CONFIG [--nproc_per_node N] [--device-memory SIZE] [--json] [key=value ...]``.

Reads the run's settings from the config (with the recipe's defaults for keys it leaves out), builds its models on
the meta device (no memory, no weights read) and hands both to :func:`tune.training.estimate_memory`. When the
total does not fit the device, the knobs of docs/memory_and_speed.md are tried in order of cost, each on top of the
ones before, until one fits.
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tune._cli._common import HelpFormatter, IntermixedArgumentParser, examples, print_table
from tune.config import (
    ConfigError,
    ConfigProblem,
    RecipeInfo,
    TuneError,
    find_config,
    find_recipe,
    get_component_from_path,
    import_modules,
    instantiate,
    load_config,
    read_recipe_info,
    recipe_defaults,
    recipes_for_config,
    shipped_config_name,
)
from tune.config._training import optional_key_tables

_UNITS = {"": 2**30, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6}
_UNITS.update({"g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40, "tb": 10**12})
# objective by the loss the config names: (label, sequences per sample)
_OBJECTIVES = {
    "DPOLoss": ("DPO", 2),
    "ORPOLoss": ("ORPO", 2),
    "KTOLoss": ("KTO", 2),  # each example and its mismatched KL row
    "RewardModelLoss": ("reward model", 2),
    "GRPOLoss": ("GRPO", 1),
    "PPOLoss": ("PPO", 1),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="estimate a config's peak memory per device, and whether it fits",
        description=(
            "Estimate the peak memory per device of training with a config, without running it: its models are\n"
            "built on the meta device (no weights are read; seconds even for 70B). Prints weights, gradients,\n"
            "optimizer state, activations, the loss's logits, frozen models (references, teachers, reward models)\n"
            "and a process baseline, sharded over --nproc_per_node ranks for the distributed recipes. When the\n"
            "total does not fit --device-memory, the knobs of docs/memory_and_speed.md are tried in order of cost\n"
            "until one fits. Estimates run within 15% of measured CPU peak RSS (benchmarks/bench_estimate.py)."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune estimate llama3_2/1B_lora_single_device --device-memory 24GiB",
            "tune estimate llama3_1/70B_lora --nproc_per_node 8 --device-memory 80GiB",
            "tune estimate my.yaml --recipe full_finetune_single_device batch_size=8 --json",
        ),
    )
    parser.__class__ = IntermixedArgumentParser  # key=value overrides may follow the options
    parser.add_argument(
        "config", metavar="CONFIG", help="config name or YAML file; e.g. llama3_2/1B_full_single_device"
    )
    add_estimate_arguments(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of the table; e.g. --json | jq .estimate.peak",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="key=value",
        help="overrides applied before estimating; e.g. batch_size=2 enable_activation_checkpointing=True",
    )


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``tune estimate`` shares with ``tune validate --estimate``."""
    if not any("--recipe" in action.option_strings for action in parser._actions):
        parser.add_argument(
            "--recipe",
            metavar="NAME",
            help="the recipe the config is for; defaults to the one claiming the config; e.g. --recipe "
            "full_finetune_distributed",
        )
    parser.add_argument(
        "--nproc_per_node",
        "--nproc-per-node",
        dest="nproc_per_node",
        type=int,
        default=1,
        metavar="N",
        help="ranks per node of a distributed recipe (as given to `tune run`); default 1; e.g. --nproc_per_node 8",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="M",
        help="nodes of --nproc_per_node ranks each; default 1; e.g. --nnodes 2",
    )
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory of one device (a bare number is GiB); default: the current CUDA device's, host RAM for "
        "device: cpu; e.g. --device-memory 80GiB, 24GB, 16000MiB",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="leave out the baseline (the CPU process's libraries, or the CUDA context), e.g. to compare with "
        "torch.cuda.max_memory_allocated",
    )


def run(args: argparse.Namespace) -> int:
    report = estimate_config(
        args.config,
        args.overrides,
        recipe=args.recipe,
        world_size=args.nproc_per_node * args.nnodes,
        device_memory=args.device_memory,
        baseline=not args.no_baseline,
    )
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print_report(report)
    return 0


# ------------------------------------------------------------------------------------------------ the settings


@dataclass
class Settings:
    """What the estimate reads from a config; the suggestions change these and estimate again."""

    recipe: str | None
    distributed: bool
    device: str
    dtype: str
    batch_size: int
    seq_len: int
    gradient_accumulation_steps: int
    optimizer: str
    optimizer_kwargs: dict
    optimizer_in_bwd: bool
    activation_checkpointing: bool
    activation_offloading: bool
    loss: str
    num_output_chunks: int
    objective: str
    sequences_per_sample: int
    world_size: int
    tensor_parallel_dim: int
    context_parallel_dim: int
    fsdp_cpu_offload: bool
    fsdp_reshard_after_forward: bool
    model_node: Any
    model_key: str
    method: str = ""
    changes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """One estimate of a config, with the settings it used and the suggestions when it does not fit."""

    config: str
    settings: Settings
    estimate: Any  # tune.training.MemoryEstimate
    suggestions: list[tuple[str, Any]]  # (a change on top of the ones before, the estimate with it)

    def as_dict(self) -> dict:
        """Plain types for ``--json``."""
        s = self.settings
        return {
            "config": self.config,
            "recipe": s.recipe,
            "method": s.method,
            "settings": {
                "device": s.device,
                "dtype": s.dtype,
                "batch_size": s.batch_size,
                "seq_len": s.seq_len,
                "gradient_accumulation_steps": s.gradient_accumulation_steps,
                "optimizer": s.optimizer,
                "optimizer_in_bwd": s.optimizer_in_bwd,
                "enable_activation_checkpointing": s.activation_checkpointing,
                "enable_activation_offloading": s.activation_offloading,
                "loss": s.loss,
                "world_size": s.world_size,
                "tensor_parallel_dim": s.tensor_parallel_dim,
                "context_parallel_dim": s.context_parallel_dim,
                "fsdp_cpu_offload": s.fsdp_cpu_offload,
            },
            "estimate": self.estimate.as_dict(),
            "suggestions": [{"change": c, "peak": e.peak, "fits": e.fits} for c, e in self.suggestions],
        }


def estimate_config(
    config: str,
    overrides: list[str] = (),
    *,
    recipe: str | None = None,
    world_size: int = 1,
    device_memory: str | int | None = None,
    baseline: bool = True,
    suggest: bool = True,
) -> Report:
    """Estimates a config's peak memory per device (what ``tune estimate`` prints).

    Args:
        config (str): a config name or YAML path.
        overrides (list[str]): ``key=value`` overrides.
        recipe (str | None): the recipe; None for the one claiming a shipped config.
        world_size (int): ranks of a distributed recipe.
        device_memory (str | int | None): bytes, or a size like ``"80GiB"``; None for the current CUDA device's
            (host RAM for ``device: cpu``), or unknown.
        baseline (bool): count the process (CPU) or CUDA-context baseline.
        suggest (bool): when it does not fit, try the knobs that would make it fit.

    Returns:
        Report: the settings, the estimate and the suggestions.

    Raises:
        TuneError: for a config that cannot be read or built, or a bad option, in one line.
    """
    path = find_config(config)
    info = _recipe(config, path, recipe)
    cfg = load_config(path, list(overrides))
    import_modules(cfg)
    if world_size < 1:
        raise TuneError(f"--nproc_per_node must be at least 1, got {world_size}")
    settings = _settings(cfg, info, world_size)
    memory = _device_memory(device_memory, settings.device)
    models = _Models(cfg, settings)
    estimate = _estimate(models, settings, baseline, memory)
    suggestions = _suggest(models, settings, baseline, memory) if suggest and estimate.fits is False else []
    return Report(config, settings, estimate, suggestions)


def _recipe(config: str, path: Path, name: str | None) -> RecipeInfo | None:
    if name:
        return find_recipe(name)
    shipped = shipped_config_name(path) if Path(config).is_file() else config
    claiming = recipes_for_config(shipped) if shipped else []
    return claiming[0] if len(claiming) == 1 else None


def _settings(cfg: DictConfig, info: RecipeInfo | None, world_size: int) -> Settings:
    tables = optional_key_tables(read_recipe_info(info.path)) if info else []
    defaults = recipe_defaults(tables) if tables else {}
    distributed = "distributed" in tables or (info is not None and "distributed" in info.name)

    def get(key: str, fallback: Any = None) -> Any:
        value = cfg.get(key, defaults.get(key, fallback))
        return fallback if value is None else value

    def count(key: str, fallback: int = 1) -> int:
        value = get(key, fallback)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(ConfigProblem(key, "must be a positive integer", value))
        return value

    def flag(key: str) -> bool:
        value = get(key, False)
        if not isinstance(value, bool):
            raise ConfigError(ConfigProblem(key, "must be true or false", value))
        return value

    if world_size > 1 and not distributed:
        name = info.name if info else "this recipe"
        raise TuneError(f"--nproc_per_node {world_size}: {name} runs on one device; use a *_distributed recipe")
    model_key = "model" if "model" in cfg else "policy_model" if "policy_model" in cfg else None
    if model_key is None:
        raise ConfigError("the config has no `model` (or `policy_model`) to estimate")
    loss_name = _component(cfg.get("loss"))
    objective, sequences = _OBJECTIVES.get(loss_name, ("SFT", 1))
    if "teacher_model" in cfg:
        objective = "KD"
    optimizer = cfg.get("optimizer") or {}
    optimizer_kwargs = {k: v for k, v in optimizer.items() if k in ("amsgrad", "momentum", "centered")}
    seq_len = (cfg.get("tokenizer") or {}).get("max_seq_len") or 0
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 0:
        raise ConfigError(ConfigProblem("tokenizer.max_seq_len", "must be a positive integer", seq_len))
    if objective in ("GRPO", "PPO"):
        seq_len += count("max_generated_tokens")
    batch_size = count("batch_size")
    accumulation = count("gradient_accumulation_steps")
    if objective == "GRPO":
        batch_size = count("forward_batch_size", batch_size * count("grpo_samples"))
    if objective == "PPO":
        batch_size = max(1, count("ppo_batch_size", batch_size) // accumulation)
    tp, cp = count("tensor_parallel_dim"), count("context_parallel_dim")
    if world_size % (tp * cp):
        raise TuneError(
            f"--nproc_per_node {world_size} is not a multiple of tensor_parallel_dim x context_parallel_dim "
            f"({tp} x {cp})"
        )
    return Settings(
        recipe=info.name if info else None,
        distributed=distributed,
        device=str(get("device", "cuda")),
        dtype=str(get("dtype", "bf16")),
        batch_size=batch_size,
        seq_len=int(seq_len),
        gradient_accumulation_steps=accumulation,
        optimizer=_component(optimizer) or "torch.optim.AdamW",
        optimizer_kwargs=optimizer_kwargs,
        optimizer_in_bwd=flag("optimizer_in_bwd"),
        activation_checkpointing=flag("enable_activation_checkpointing"),
        activation_offloading=flag("enable_activation_offloading"),
        loss=_loss_kind(loss_name, objective),
        num_output_chunks=int((cfg.get("loss") or {}).get("num_output_chunks", 8) or 8),
        objective=objective,
        sequences_per_sample=sequences,
        world_size=world_size,
        tensor_parallel_dim=tp,
        context_parallel_dim=cp,
        fsdp_cpu_offload=flag("fsdp_cpu_offload"),
        fsdp_reshard_after_forward=get("fsdp_reshard_after_forward", True) is not False,
        model_node=cfg[model_key],
        model_key=model_key,
    )


def _component(node: Any) -> str:
    if isinstance(node, (dict, DictConfig)) and "_component_" in node:
        return str(node["_component_"]).rsplit(".", 1)[-1] if node["_component_"] else ""
    return ""


def _loss_kind(loss_name: str, objective: str) -> str:
    if objective == "reward model":
        return "none"
    if loss_name in ("LinearCrossEntropyLoss",) or objective in ("DPO", "ORPO", "KTO", "GRPO", "PPO"):
        return "linear"  # the preference and RL recipes project hidden states in chunks (tune.rlhf)
    if loss_name == "CEWithChunkedOutputLoss" and objective != "KD":
        return "linear"  # on tune's models it runs as LinearCrossEntropyLoss (tune.training.prepare_loss)
    if "Chunked" in loss_name:
        return "chunked"
    return "full"


def _device_memory(value: str | int | None, device: str) -> int | None:
    if isinstance(value, int):
        return value
    if value:
        return parse_size(value)
    if device.startswith("cpu"):
        try:  # host RAM
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return None


def parse_size(text: str) -> int:
    """``"80GiB"``, ``"24GB"``, ``"16000MiB"``, ``"80"`` (GiB) -> bytes.

    Raises:
        TuneError: for text that is not a size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise TuneError(f"--device-memory {text!r} is not a size; e.g. 80GiB, 24GB, 16000MiB, or 80 (GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


# -------------------------------------------------------------------------------------------------- the models


class _Models:
    """The config's models built on the meta device, once each (the suggestions reuse them)."""

    def __init__(self, cfg: DictConfig, settings: Settings) -> None:
        self.cfg = cfg
        self._built: dict[tuple, Any] = {}
        self.model = self.build(settings.model_node, settings.dtype, settings.model_key)

    def build(self, node: Any, dtype: str, key: str) -> Any:
        import torch

        from tune import training, utils

        cache_key = (id(node), dtype)
        if cache_key not in self._built:
            try:
                with training.set_default_dtype(utils.get_dtype(dtype)), torch.device("meta"):
                    model = instantiate(node)
            except TuneError:
                raise
            except Exception as err:  # noqa: BLE001 - the builder's own error, named with the key
                message = f"{key}: could not build the model on the meta device: {type(err).__name__}: {err}"
                raise ConfigError(message) from err
            self._built[cache_key] = model
        return self._built[cache_key]


def _estimate(models: _Models, s: Settings, baseline: bool, memory: int | None, model: Any = None) -> Any:
    from tune import training
    from tune.modules.peft import get_adapter_params

    model = model if model is not None else models.model
    cfg = models.cfg
    adapters = bool(get_adapter_params(model))
    nf4 = any(type(p).__name__ == "NF4Tensor" for p in model.parameters())
    s.method = f"{'QLoRA' if nf4 else 'LoRA' if adapters else 'full'} {s.objective}"
    frozen, trained_others, kv_cache = [], [], 0
    seq = s.seq_len
    if s.objective in ("DPO", "KTO", "GRPO") and not adapters:
        beta = (cfg.get("loss") or {}).get("beta", 1.0)
        if s.objective != "GRPO" or beta:
            frozen.append(training.FrozenModel("reference", model, s.batch_size * s.sequences_per_sample, seq))
    if s.objective == "KD":
        teacher = models.build(cfg.teacher_model, s.dtype, "teacher_model")
        frozen.append(training.FrozenModel("teacher", teacher, s.batch_size, seq, logits=True))
    if s.objective == "PPO":
        value = models.build(cfg.reward_and_value_model, s.dtype, "reward_and_value_model")
        trained_others.append(value)
        frozen.append(training.FrozenModel("reference policy", model, s.batch_size, seq))
        frozen.append(training.FrozenModel("reward model", value, s.batch_size, seq))
    if s.objective in ("GRPO", "PPO"):
        generating = int(cfg.get("forward_batch_size") or s.batch_size)
        kv_cache = _kv_cache_bytes(model, generating, seq)
    device_type = "cpu" if s.device.startswith("cpu") else "cuda"
    if baseline:
        baseline_bytes = training.CPU_PROCESS_BASELINE_BYTES if device_type == "cpu" else training.CUDA_CONTEXT_BYTES
    else:
        baseline_bytes = 0
    if seq <= 0:
        raise ConfigError("tokenizer.max_seq_len is not set: give it (e.g. tokenizer.max_seq_len=2048) to estimate")
    return training.estimate_memory(
        model,
        batch_size=s.batch_size,
        seq_len=seq,
        trainable="adapters" if adapters else "all",
        optimizer=s.optimizer,
        optimizer_kwargs=s.optimizer_kwargs,
        optimizer_in_bwd=s.optimizer_in_bwd,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        activation_checkpointing=s.activation_checkpointing,
        activation_offloading=s.activation_offloading,
        loss=s.loss,
        num_output_chunks=s.num_output_chunks,
        sequences_per_sample=s.sequences_per_sample,
        world_size=s.world_size,
        tensor_parallel_dim=s.tensor_parallel_dim,
        context_parallel_dim=s.context_parallel_dim,
        fsdp_cpu_offload=s.fsdp_cpu_offload,
        fsdp_reshard_after_forward=s.fsdp_reshard_after_forward,
        frozen_models=frozen,
        trainable_models=trained_others,
        kv_cache_bytes=kv_cache // s.tensor_parallel_dim,  # each data-parallel rank generates its own batch
        device_type=device_type,
        baseline_bytes=baseline_bytes,
        device_memory=memory,
    )


def _kv_cache_bytes(model: Any, num_sequences: int, seq_len: int) -> int:
    from tune.training._memory_estimate import _layers

    total = 0
    for layer in _layers(model):
        attn = getattr(layer, "attn", None)
        kv_heads, head_dim = getattr(attn, "num_kv_heads", 0), getattr(attn, "head_dim", 0)
        weight = next(iter(layer.parameters()), None)
        itemsize = weight.element_size() if weight is not None else 2
        total += 2 * num_sequences * seq_len * kv_heads * head_dim * itemsize
    return total


# ----------------------------------------------------------------------------------------------- suggestions


def _suggest(models: _Models, settings: Settings, baseline: bool, memory: int) -> list[tuple[str, Any]]:
    """The knobs in order of cost, each on top of the ones before, until the estimate fits: (change, estimate)."""
    steps: list[tuple[str, Any]] = []
    state = (settings, models.model)
    for knob in (_checkpointing, _offloading, _smaller_batch, _in_backward, _lora, _qlora, _more_ranks, _cpu_offload):
        found = knob(models, *state, baseline, memory)
        if found is None:
            continue
        change, new_settings, new_model, estimate = found
        state = (new_settings, new_model)
        steps.append((change, estimate))
        if estimate.fits:
            break
    return steps


def _checkpointing(models, s, model, baseline, memory):  # noqa: ANN001, ANN202 - the knobs share one signature
    if s.activation_checkpointing:
        return None
    s = replace(s, activation_checkpointing=True)
    return "enable_activation_checkpointing=True", s, model, _estimate(models, s, baseline, memory, model)


def _offloading(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
    if s.activation_offloading or s.device.startswith("cpu"):
        return None
    s = replace(s, activation_offloading=True)
    return "enable_activation_offloading=True", s, model, _estimate(models, s, baseline, memory, model)


def _smaller_batch(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
    """The largest halving of the batch that fits (or batch 1), with the accumulation that keeps the step's size."""
    found, batch, accumulation = None, s.batch_size, s.gradient_accumulation_steps
    while batch > 1:
        batch, accumulation = max(1, batch // 2), accumulation * 2
        new = replace(s, batch_size=batch, gradient_accumulation_steps=accumulation)
        change = f"batch_size={batch} gradient_accumulation_steps={accumulation}"
        found = change, new, model, _estimate(models, new, baseline, memory, model)
        if found[3].fits:
            break
    return found


def _in_backward(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
    if s.distributed or s.optimizer_in_bwd or not s.method.startswith("full") or s.objective != "SFT":
        return None
    s = replace(s, optimizer_in_bwd=True, gradient_accumulation_steps=1)
    change = "optimizer_in_bwd=True gradient_accumulation_steps=1 clip_grad_norm=null"
    return change, s, model, _estimate(models, s, baseline, memory, model)


def _peft(prefix: str, label: str):  # noqa: ANN202
    def knob(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
        variant = None if s.method.startswith(label) else _peft_variant(models, s, prefix)
        if variant is None:
            return None
        s = replace(s, optimizer_in_bwd=False)
        change = f"model._component_={variant[0]} (a {label} recipe and config)"
        return change, s, variant[1], _estimate(models, s, baseline, memory, variant[1])

    return knob


_lora, _qlora = _peft("lora_", "LoRA"), _peft("qlora_", "QLoRA")


def _ranks_flags(world: int) -> str:
    return f"--nproc_per_node {min(world, 8)}" + (f" --nnodes {world // 8}" if world > 8 else "")


def _more_ranks(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
    """The fewest ranks (doubling, up to 8 nodes of 8) that fit, for a distributed recipe."""
    if not s.distributed:
        return None
    found, world = None, s.world_size
    while world < 64:
        world *= 2
        new = replace(s, world_size=world)
        found = _ranks_flags(world), new, model, _estimate(models, new, baseline, memory, model)
        if found[3].fits:
            break
    return found


def _cpu_offload(models, s, model, baseline, memory):  # noqa: ANN001, ANN202
    if not s.distributed or s.fsdp_cpu_offload:
        return None
    s = replace(s, fsdp_cpu_offload=True)
    return "fsdp_cpu_offload=True", s, model, _estimate(models, s, baseline, memory, model)


def _peft_variant(models: _Models, s: Settings, prefix: str) -> tuple[str, Any] | None:
    """The config's model as its family's LoRA or QLoRA builder (``llama3_2_1b`` -> ``lora_llama3_2_1b``)."""
    path = str(s.model_node.get("_component_", ""))
    module, _, name = path.rpartition(".")
    base = re.sub(r"^q?lora_", "", name)
    target = f"{module}.{prefix}{base}"
    if target == path:
        return None
    try:
        get_component_from_path(target)
    except Exception:  # noqa: BLE001 - the family has no such builder
        return None
    node = DictConfig({"_component_": target, "lora_attn_modules": ["q_proj", "v_proj", "output_proj"]})
    node["apply_lora_to_mlp"] = True
    try:
        return target, models.build(node, s.dtype, "model")
    except TuneError:
        return None


# ---------------------------------------------------------------------------------------------------- output


def gib(num_bytes: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{num_bytes / 2**30:,.2f} GiB"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def print_report(report: Report, file: Any = None) -> None:
    """The table of ``tune estimate``."""
    file = file or sys.stdout
    s, e = report.settings, report.estimate
    ranks = f"{s.world_size} device{'s' if s.world_size > 1 else ''}"
    if s.world_size > 1:
        ranks += f" (FSDP over {e.shards}, tp {s.tensor_parallel_dim}, cp {s.context_parallel_dim})"
    print(
        f"{report.config}: {s.method} with {s.recipe or 'no recipe (--recipe NAME)'} on {ranks}, {s.dtype}", file=file
    )
    knobs = [
        f"batch {s.batch_size} x {s.seq_len} tokens"
        + (f" x {s.sequences_per_sample} sequences" if s.sequences_per_sample > 1 else ""),
        f"grad. accumulation {s.gradient_accumulation_steps}",
        f"activation checkpointing {'on' if s.activation_checkpointing else 'off'}",
        s.optimizer + (" in backward" if s.optimizer_in_bwd else ""),
    ]
    print(
        f"model: {_count(e.num_params)} parameters, {_count(e.num_trainable)} trainable; {', '.join(knobs)}", file=file
    )
    rows = [(term, gib(value)) for term, value in e.terms.items() if value or term in ("weights",)]
    if e.phase == "checkpoint load":
        rows.append(("(while the checkpoint loads)", gib(e.load_peak)))
    rows.append((f"peak per device ({e.phase})", gib(e.peak)))
    for term, value in e.host.items():
        rows.append((f"host: {term}", gib(value)))
    print_table(("term", "memory"), rows, file=file)
    for note in e.notes:
        print(f"note: {note}", file=file)
    if e.device_memory is None:
        print("device memory unknown: give --device-memory SIZE (e.g. 80GiB) to check the fit", file=file)
        return
    used = 100 * e.peak / e.device_memory
    verdict = "fits" if e.fits else "does NOT fit"
    print(f"{verdict} in {gib(e.device_memory)} ({used:.0f}% used)", file=file)
    if e.fits:
        return
    if not report.suggestions:
        print("no knob of this config makes it fit: a larger device or more of them", file=file)
        return
    print("to make it fit, in order of cost (each on top of the ones before):", file=file)
    for change, estimate in report.suggestions:
        verdict = "fits" if estimate.fits else "does not fit"
        print(f"  + {change}: {gib(estimate.peak)}, {verdict}", file=file)
