"""What every training recipe does with its config, written once: the optional keys and their defaults, the
checks of the training settings, the LR scheduler given the run length, and the batch collator.

A recipe names the tables of optional keys it reads in its ``RECIPE_INFO`` (``"optional_keys": ["finetune",
"lora"]``); :func:`~tune.config.parse` and ``tune validate`` fill the keys a config leaves out from those tables
before anything else looks at the config, so the recipe reads ``cfg.clip_grad_norm`` like any other key, the
saved config shows the values that ran, and ``tune validate CONFIG --show-defaults`` prints them.
"""

import contextlib
import difflib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from tune.config._errors import _NO_VALUE, ConfigError, ConfigProblem
from tune.config._instantiate import get_component_from_path, instantiate
from tune.utils import get_logger

log = get_logger(name="tune.config")

# Optional keys of the training recipes and the value each takes when a config leaves it out: torchtune's
# default where torchtune had the key, "off" for the keys it lacked. One table per concern; a recipe lists the
# tables it reads in RECIPE_INFO["optional_keys"].
OPTIONAL_KEYS: dict[str, dict[str, Any]] = {
    "finetune": {
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "clip_grad_norm": None,
        "compile": False,
        "optimizer_in_bwd": False,
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "lr_scheduler": None,
        "profiler": None,
        # the batch collator (see DEFAULT_NOTES); a packed dataset turns padded_collate_sft into
        # padded_collate_packed
        "collate_fn": None,
        "keep_last_n_checkpoints": None,
        # a second run into an output_dir that holds an earlier run's checkpoints, logs or config.yaml is refused
        # unless it resumes (resume_from_checkpoint) or sets this: the earlier run's outputs are then moved to
        # output_dir/overwritten_<time>/, never mixed with the new run's (tune.config.check_output_dir)
        "overwrite_output_dir": False,
        "save_every_n_steps": None,
        "dataset_val": None,
        "run_val_every_n_steps": None,
        "max_validation_steps": None,
        "model_converters": None,
        "finetuning_schedule": None,
        "finetuning_schedule_auto_transition": None,
    },
    "lora": {
        "save_adapter_weights_only": False,
    },
    "distributed": {
        "dist_backend": None,  # null: gloo on CPU; "cuda:nccl,cpu:gloo" on GPUs
        "tensor_parallel_dim": 1,
        "tensor_parallel_plan": None,  # null: the model family's plan
        # ranks that share each sequence, a slice each (tune.training.ContextParallel): for sequences too long for
        # one device's activations. Must divide the number of processes / tensor_parallel_dim
        "context_parallel_dim": 1,
        "fsdp_cpu_offload": False,
        "fsdp_reshard_after_forward": True,
        "fsdp_mixed_precision": None,
    },
    # the SFT recipes' mixture-of-experts settings (no effect on a model without MoE layers). transformers' name
    # and meaning: the weight of the load-balancing loss added to the loss; 0 (transformers' behaviour unless
    # output_router_logits is set) still logs it (tune.training.RouterAuxLoss)
    "moe": {
        "router_aux_loss_coef": 0.0,
        # distributed recipes: ranks per expert-parallel group, each holding num_experts / expert_parallel_dim
        # whole experts and exchanging tokens by all-to-all (tune.training.apply_expert_parallel); 1: FSDP alone
        # shards the experts. Must divide the number of processes and of experts; needs tensor_parallel_dim: 1
        "expert_parallel_dim": 1,
    },
    # preference recipes (the DPO recipes), read after "finetune": pairs are collated chosen sequences first,
    # then rejected ones (see DEFAULT_NOTES: padding-free on CPU, padded elsewhere); pairs are not packed
    "dpo": {
        "collate_fn": None,
        # TRL's name: the reference log-probs of every training pair computed once before training (one forward
        # pass per step less; full_dpo_distributed also scores the validation pairs and then frees the reference)
        "precompute_ref_log_probs": False,
    },
    # the KTO recipes, read after "finetune": unpaired examples with their desirable flags and KL rows, padded
    "kto": {
        "collate_fn": "tune.data.padded_collate_kto",
    },
    # the full-fine-tuning recipes with a frozen reference model (full_dpo_distributed, kto_distributed): its
    # checkpoint, sharded like the policy (torchtune's key; LoRA's reference is the model with adapters disabled)
    "reference": {
        "ref_checkpointer": None,
    },
    # the reward-model recipes, read after "finetune": pairs collated chosen sequences first, then rejected ones
    # (see DEFAULT_NOTES: padding-free on CPU, padded elsewhere)
    "reward": {
        "collate_fn": None,
    },
    # the GRPO recipes, read after "finetune" (their required keys, checked with these: grpo_samples,
    # forward_batch_size, max_generated_tokens, reward_functions; see _MINIMUMS and _reward_problems)
    "grpo": {
        "ppo_epochs": 1,  # optimizer steps per batch of completions; > 1 reuses them and the loss clips the ratio
        "temperature": 1.0,
        "top_k": None,
        "reward_weights": None,
        # a GRPO step optimises all its completions, in micro-batches of forward_batch_size: nothing to accumulate
        "gradient_accumulation_steps": 1,
    },
}


# what a null default means, where the value is decided when the run starts (printed by --show-defaults)
DEFAULT_NOTES: dict[str, str] = {
    "collate_fn": "tune.data.padding_free_collate on CPU (one row per batch, no padding), "
    "tune.data.padded_collate_sft elsewhere; preference pairs (dpo, reward): tune.data.padding_free_collate_dpo "
    "on CPU, tune.data.padded_collate_dpo elsewhere and under context parallelism",
    "dist_backend": "gloo on CPU, cuda:nccl,cpu:gloo on GPUs",
    "tensor_parallel_plan": "the model family's plan (tune.registry)",
    "clip_grad_norm": "no clipping (the grad norm is still logged)",
    "top_k": "sample from the whole vocabulary",
    "reward_weights": "1 for each reward function",
    "ref_checkpointer": "not used by LoRA or a reference-free loss (SimPO, ORPO); kto_distributed: the "
    "checkpointer's starting weights; full_dpo_distributed: required by a loss with a reference",
}


# keys torchtune's configs carry that tune's recipes accept and ignore, with the reason (warned about when set)
IGNORED_KEYS: dict[str, str] = {
    "low_cpu_ram": "tune loads checkpoints memory-mapped on every rank already",
    "custom_sharded_layers": "FSDP2 units are every transformer layer (or the model family's rule) plus the root",
    "fsdp": "torchtune 0.6.1's recipes do not read it either; FSDP2 is set by fsdp_cpu_offload and "
    "fsdp_reshard_after_forward",
}
# top-level keys tune itself reads from every config
_TUNE_KEYS = {"imports"}
# integer keys of a table's recipes and their lower bounds, checked with the training settings (a group of one
# completion has no advantage: grpo_samples >= 2)
_MINIMUMS: dict[str, dict[str, int]] = {
    "grpo": {"grpo_samples": 2, "ppo_epochs": 1, "forward_batch_size": 1, "max_generated_tokens": 1},
}
# required keys that the checks of a table read (check_training_config for "finetune")
_CHECKED_KEYS = {
    "finetune": {"epochs", "gradient_accumulation_steps", "max_steps_per_epoch"},
    "grpo": {*_MINIMUMS["grpo"], "reward_functions"},
}


def known_keys(tables: Sequence[str]) -> set[str]:
    """The top-level keys the tables of a recipe account for: their optional keys and the keys their checks read."""
    return set(recipe_defaults(tables)).union(*(_CHECKED_KEYS.get(t, set()) for t in tables))


_INTERPOLATION_ROOT = re.compile(r"\$\{([A-Za-z_][\w]*)")


def unknown_key_problems(cfg: DictConfig, known: Iterable[str]) -> list[ConfigProblem]:
    """Top-level keys of ``cfg`` that no recipe reads: typos, each with the closest known name.

    A key is known when the recipe reads it (``known``: what the recipe scan saw plus its optional keys), tune
    reads it (``imports``), another value refers to it (``${assets_dir}/...``: a variable of the config), or it
    is one of torchtune's keys that tune ignores (:data:`IGNORED_KEYS`, warned about separately).

    Args:
        cfg (DictConfig): the config.
        known (Iterable[str]): the top-level keys the recipe reads.

    Returns:
        list[ConfigProblem]: one per unknown key.
    """
    known = set(known) | _TUNE_KEYS | set(IGNORED_KEYS) | _interpolation_roots(cfg)
    problems = []
    for key in cfg.keys():
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.append(
            ConfigProblem(str(key), f"unknown key: the recipe does not read it. {hint}Remove it, or fix its name")
        )
    return problems


def check_config_keys(cfg: DictConfig, recipe_file: str | None, tables: Sequence[str]) -> None:
    """Rejects the top-level keys of ``cfg`` that the recipe in ``recipe_file`` never reads (see
    :func:`unknown_key_problems`), and warns about torchtune keys tune ignores.

    Raises:
        ConfigError: listing every unknown key with the closest known name.
    """
    from tune.config._recipe_scan import scan_recipe

    if recipe_file is None:
        return
    known = scan_recipe(recipe_file).mentioned | known_keys(tables)
    problems = unknown_key_problems(cfg, known)
    if problems:
        raise ConfigError(problems)
    warn_ignored_keys(cfg)


def warn_ignored_keys(cfg: DictConfig) -> None:
    """Warns about each key of :data:`IGNORED_KEYS` that ``cfg`` sets: it has no effect in tune."""
    for key, why in IGNORED_KEYS.items():
        if key in cfg.keys():
            log.warning("%s has no effect in tune (%s); it can be removed from the config.", key, why)


def _interpolation_roots(cfg: DictConfig) -> set[str]:
    roots: set[str] = set()
    stack = [OmegaConf.to_container(cfg, resolve=False)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            roots.update(_INTERPOLATION_ROOT.findall(node))
    return roots


def recipe_defaults(tables: Sequence[str]) -> dict[str, Any]:
    """The optional keys of the named tables of :data:`OPTIONAL_KEYS`, merged in order.

    Raises:
        ValueError: for a table name that does not exist.
    """
    defaults: dict[str, Any] = {}
    for table in tables:
        if table not in OPTIONAL_KEYS:
            raise ValueError(f"unknown table of optional keys {table!r}; known: {', '.join(OPTIONAL_KEYS)}")
        defaults.update(OPTIONAL_KEYS[table])
    return defaults


def optional_key_tables(recipe_info: Any) -> list[str]:
    """The tables of optional keys a recipe names in its ``RECIPE_INFO`` (none for a recipe without one)."""
    if not isinstance(recipe_info, dict):
        return []
    return list(recipe_info.get("optional_keys", []))


def apply_defaults(cfg: DictConfig, tables: Sequence[str]) -> list[str]:
    """Sets every optional key of ``tables`` that ``cfg`` lacks to its default, in place.

    Returns:
        list[str]: the keys that were filled in.
    """
    filled = []
    with open_dict(cfg):
        for key, value in recipe_defaults(tables).items():
            if key not in cfg.keys():  # `in` is False for a `???` value too: that one stays, to be reported
                cfg[key] = value
                filled.append(key)
    return filled


@contextlib.contextmanager
def errors_at(key: str, value: Any = _NO_VALUE) -> Iterator[None]:
    """Reports a ``ValueError`` raised inside the block as a :class:`ConfigError` at config key ``key``.

    Components raise ``ValueError`` for bad arguments without knowing which config key gave them; the recipe
    knows, and wraps the call::

        with config.errors_at("model_converters"):
            model = training.apply_model_converters(model, converters)
    """
    try:
        yield
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(ConfigProblem(key, str(err), value)) from err


@dataclass(frozen=True)
class KeepDefault:
    """An entry of a recipe's ``UNSUPPORTED`` table: the key must keep the default of the recipe's optional-keys
    tables (``"tensor_parallel_dim": KeepDefault("this recipe shards with FSDP2 only")``), where a plain reason
    refuses any value but null or False.

    Args:
        reason (str): why the recipe needs the default, shown with the problem.
    """

    reason: str


def check_training_config(
    cfg: DictConfig,
    *,
    distributed: bool = False,
    unsupported: dict[str, "str | KeepDefault"] | None = None,
    tables: Sequence[str] = ("finetune",),
) -> None:
    """Checks the training settings every training recipe shares, before anything is loaded or built.

    Checked: ``gradient_accumulation_steps``, ``log_every_n_steps``, ``save_every_n_steps``,
    ``run_val_every_n_steps`` (and that ``dataset_val`` exists for it), ``max_validation_steps``,
    ``optimizer_in_bwd`` (with clipping, accumulation, a finetuning schedule and distributed runs), the order of
    ``model_converters``, the phases of ``finetuning_schedule``, the keys of the recipe's other tables (the GRPO
    group size, batch sizes and rewards for ``"grpo"``), and that the keys a recipe does not support are off or
    keep their defaults. Expects the optional keys filled in (:func:`apply_defaults`).

    Args:
        cfg (DictConfig): the recipe config.
        distributed (bool): whether the recipe is a distributed one.
        unsupported (dict[str, str | KeepDefault] | None): keys (dotted paths, e.g. ``dataset.packed``) the recipe
            does not support, each with the reason: a string refuses any value but null or False, a
            :class:`KeepDefault` any value but the key's default in ``tables``.
        tables (Sequence[str]): the recipe's tables of optional keys (its ``RECIPE_INFO["optional_keys"]``).
            Default ``("finetune",)``.

    Raises:
        ConfigError: listing every problem at once, each with its key.
        ValueError: if ``unsupported`` keeps the default of a key that none of ``tables`` has (a recipe's mistake).
    """
    problems = training_config_problems(cfg, distributed=distributed) + table_problems(cfg, tables)
    defaults = recipe_defaults(tables)
    for key, reason in (unsupported or {}).items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if isinstance(reason, KeepDefault):
            if key not in defaults:
                raise ValueError(
                    f"UNSUPPORTED keeps the default of {key!r}, which none of the tables {list(tables)} has"
                )
            if value != defaults[key]:
                shown = _yaml_value(defaults[key])
                message = f"must be {shown} in this recipe ({reason.reason}); set it to {shown} or remove it"
                problems.append(ConfigProblem(key, message, value))
        elif value is not None and value is not False:
            problems.append(ConfigProblem(key, f"is not supported by this recipe ({reason}); remove it", value))
    problems += check_model_converters(cfg.model_converters)
    problems += check_finetuning_schedule(cfg.finetuning_schedule, cfg.finetuning_schedule_auto_transition)
    if problems:
        raise ConfigError(problems)


def _yaml_value(value: Any) -> str:
    return "null" if value is None else str(value)


def table_problems(cfg: DictConfig, tables: Sequence[str]) -> list[ConfigProblem]:
    """The problems of the keys that the recipe's tables of optional keys check (:data:`_MINIMUMS`, and the reward
    functions and weights of ``"grpo"``), all at once.

    Args:
        cfg (DictConfig): the config, its optional keys filled in.
        tables (Sequence[str]): the recipe's tables.

    Returns:
        list[ConfigProblem]: one per bad key.
    """
    problems = []
    for table in tables:
        for key, low in _MINIMUMS.get(table, {}).items():
            value = cfg.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                problems.append(ConfigProblem(key, f"must be an integer >= {low}", value))
    if "grpo" in tables:
        problems += _reward_problems(cfg.get("reward_functions"), cfg.get("reward_weights"))
    return problems


def _reward_problems(functions: Any, weights: Any) -> list[ConfigProblem]:
    if not isinstance(functions, ListConfig) or len(functions) == 0:
        message = (
            "must be a non-empty list of reward functions: _component_ entries (e.g. tune.rlhf.AnswerReward) or "
            "dotted paths of functions (my_rewards.length_penalty)"
        )
        return [ConfigProblem("reward_functions", message, functions)]
    if weights is None:
        return []
    if not isinstance(weights, ListConfig):
        return [ConfigProblem("reward_weights", "must be a list of one weight per reward function, or null", weights)]
    if len(weights) != len(functions):
        message = f"has {len(weights)} entries for {len(functions)} reward functions: one each, or null for 1 each"
        return [ConfigProblem("reward_weights", message, weights)]
    return []


def training_config_problems(cfg: DictConfig, *, distributed: bool = False) -> list[ConfigProblem]:
    """The problems :func:`check_training_config` reports, but for ``model_converters`` and
    ``finetuning_schedule`` (which ``tune validate`` checks for every config, with or without a recipe)."""
    problems = []
    accumulate = cfg.get("gradient_accumulation_steps")
    if not _positive_int(accumulate):
        problems.append(ConfigProblem("gradient_accumulation_steps", "must be an integer >= 1", accumulate))
    if not _positive_int(cfg.log_every_n_steps):
        problems.append(ConfigProblem("log_every_n_steps", "must be an integer >= 1", cfg.log_every_n_steps))
    if "epochs" in cfg and not _positive_int(cfg.epochs):  # a missing one is reported as a key the recipe reads
        problems.append(ConfigProblem("epochs", "must be an integer >= 1", cfg.get("epochs")))
    for key in ("max_steps_per_epoch", "save_every_n_steps", "run_val_every_n_steps", "max_validation_steps"):
        if cfg.get(key) is not None and not _positive_int(cfg.get(key)):
            problems.append(ConfigProblem(key, "must be a positive integer, or null to turn it off", cfg.get(key)))
    if cfg.run_val_every_n_steps is not None and cfg.dataset_val is None:
        problems.append(ConfigProblem("dataset_val", "is missing: run_val_every_n_steps needs a dataset"))
    if cfg.optimizer_in_bwd:
        problems += _check_optimizer_in_bwd(cfg, distributed)
    coef = cfg.get("router_aux_loss_coef", 0.0)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0.0 <= coef < float("inf"):
        problems.append(
            ConfigProblem("router_aux_loss_coef", "must be a number >= 0 (0: logged, not trained on)", coef)
        )
    problems += _expert_parallel_problems(cfg, distributed)
    problems += _context_parallel_problems(cfg)
    return problems


def _context_parallel_problems(cfg: DictConfig) -> list[ConfigProblem]:
    # the world size and the model are checked when known (init_parallel, check_context_parallel)
    value = cfg.get("context_parallel_dim", 1)
    if not _positive_int(value):
        return [ConfigProblem("context_parallel_dim", "must be a positive integer (1: no context parallelism)", value)]
    if value == 1:
        return []
    if cfg.get("expert_parallel_dim", 1) != 1:
        reason = "cannot be combined with expert parallelism yet: set expert_parallel_dim: 1 or context_parallel_dim: 1"
        return [ConfigProblem("context_parallel_dim", reason, value)]
    if cfg.get("compile", False):
        return [
            ConfigProblem(
                "context_parallel_dim", "cannot be combined with compile: true yet; set compile: false", value
            )
        ]
    return []


def _expert_parallel_problems(cfg: DictConfig, distributed: bool) -> list[ConfigProblem]:
    # what can be checked before the run starts; the world size and the number of experts are checked when known
    value = cfg.get("expert_parallel_dim", 1)
    if not _positive_int(value):
        return [ConfigProblem("expert_parallel_dim", "must be a positive integer (1: no expert parallelism)", value)]
    if value == 1:
        return []
    if not distributed:
        reason = "a single-device recipe holds every expert on its one device; set expert_parallel_dim: 1"
        return [ConfigProblem("expert_parallel_dim", reason, value)]
    if cfg.get("tensor_parallel_dim", 1) != 1:
        reason = "cannot be combined with tensor parallelism yet: set tensor_parallel_dim: 1 or expert_parallel_dim: 1"
        return [ConfigProblem("expert_parallel_dim", reason, value)]
    return []


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_optimizer_in_bwd(cfg: DictConfig, distributed: bool) -> list[ConfigProblem]:
    from tune import training  # imports torch: only when a recipe runs or a config is validated for one

    if distributed:
        return [
            ConfigProblem(
                "optimizer_in_bwd",
                "is not supported by the distributed recipes (FSDP2 already shards the optimizer state across ranks); "
                "set optimizer_in_bwd: False",
                True,
            )
        ]
    problems = []
    if _positive_int(cfg.gradient_accumulation_steps):
        try:
            training.OptimizerInBackward.check_compatible(cfg.clip_grad_norm, cfg.gradient_accumulation_steps)
        except ValueError as err:
            problems.append(ConfigProblem("optimizer_in_bwd", str(err), True))
    if cfg.finetuning_schedule is not None:
        problems.append(
            ConfigProblem(
                "finetuning_schedule",
                "cannot be combined with optimizer_in_bwd: True (the per-parameter optimizers of optimizer_in_bwd "
                "cannot take the param groups that later phases add). Set optimizer_in_bwd: False",
            )
        )
    return problems


def check_model_converters(converters: ListConfig | None) -> list[ConfigProblem]:
    """The ``model_converters`` entries import and come in an order that works (see
    ``tune.training.validate_converter_order``)."""
    from tune import training

    if not converters:
        return []
    if not isinstance(converters, (ListConfig, list)):
        return [ConfigProblem("model_converters", "must be a list of components", converters)]
    try:
        classes = [
            get_component_from_path(
                c.get("_component_") if isinstance(c, (DictConfig, dict)) else c, f"model_converters[{i}]._component_"
            )
            for i, c in enumerate(converters)
        ]
        training.validate_converter_order(classes)
    except ConfigError as err:
        return err.problems
    except (TypeError, ValueError) as err:
        return [ConfigProblem("model_converters", str(err))]
    return []


def check_finetuning_schedule(phases: Any, auto_transition: Any) -> list[ConfigProblem]:
    """The phases of a ``finetuning_schedule`` parse (their patterns are matched against the model later)."""
    from tune import training

    if phases is None:
        return []
    try:
        training.FinetuningSchedule(phases, auto_transition)
    except (TypeError, ValueError) as err:
        return [ConfigProblem("finetuning_schedule", f"must be a list of phases, or auto: {err}", phases)]
    return []


def instantiate_dataset(cfg_dataset: DictConfig | ListConfig, tokenizer: Any) -> Any:
    """Builds the ``dataset`` node with the tokenizer; a list of nodes (torchtune's form) builds each one and
    concatenates them in order (``torch.utils.data.ConcatDataset``; packed or not is then read from the parts).

    Raises:
        ConfigError: for an empty list, or a list mixing packed and unpacked datasets.
    """
    from torch.utils.data import ConcatDataset

    from tune import data

    built = instantiate(cfg_dataset, tokenizer)
    if not isinstance(built, list):
        return built
    if not built:
        raise ConfigError(ConfigProblem("dataset", "is an empty list: name at least one dataset"))
    dataset = ConcatDataset(built)
    with errors_at("dataset"):
        data.is_packed(dataset)  # a mix of packed and unpacked parts fits no collator
    return dataset


def component_name(node: Any) -> str:
    """The ``_component_`` of a node, or of each node of a list (``a + b``), for log lines."""
    if isinstance(node, (ListConfig, list)):
        return " + ".join(component_name(item) for item in node)
    return str(node.get("_component_", "?")) if isinstance(node, (DictConfig, dict)) else type(node).__name__


def instantiate_lr_scheduler(cfg_lr_scheduler: DictConfig | None, optimizer: Any, num_training_steps: int) -> Any:
    """Builds the ``lr_scheduler`` node for ``optimizer``, giving it the run length when it takes one.

    Schedules with a ``num_training_steps`` argument (tune's and torchtune's warmup schedules) receive the
    recipe's total number of optimizer steps unless the config sets it; any other scheduler (a plain
    ``torch.optim.lr_scheduler`` class, a user's) is built with its own arguments only.

    Args:
        cfg_lr_scheduler (DictConfig | None): the node, or ``None`` for a constant LR.
        optimizer (Any): the optimizer, passed first.
        num_training_steps (int): optimizer steps of the whole run.

    Returns:
        Any: the scheduler, or ``None``.
    """
    if cfg_lr_scheduler is None:
        return None
    component = get_component_from_path(cfg_lr_scheduler._component_, "lr_scheduler._component_")
    extra = {}
    if "num_training_steps" in _parameters(component) and "num_training_steps" not in cfg_lr_scheduler:
        extra["num_training_steps"] = num_training_steps
    return instantiate(cfg_lr_scheduler, optimizer, **extra)


def instantiate_tensor_parallel_plan(cfg_plan: DictConfig | None, model: Any, model_type: str | None) -> Any:
    """The tensor-parallel plan: the ``tensor_parallel_plan`` node when set (torchtune's key; its function gets
    ``model`` when it takes it), else the one the model family of ``model_type`` registers.

    Raises:
        ValueError: when neither exists.
    """
    from tune import training

    if cfg_plan is None:
        return training.family_tensor_parallel_plan(model, model_type)
    component = get_component_from_path(cfg_plan._component_, "tensor_parallel_plan._component_")
    return instantiate(cfg_plan, **({"model": model} if "model" in _parameters(component) else {}))


def instantiate_collate(
    cfg_collate: Any,
    dataset: Any,
    *,
    padding_idx: int,
    ignore_idx: int,
    max_seq_len: int | None = None,
    device_type: str = "cpu",
    pairs: bool = False,
    padding_free: bool = True,
) -> Callable[..., Any]:
    """The collator of the ``collate_fn`` key for ``dataset``.

    A dotted path names a function (torchtune's form: ``tune.data.padded_collate_sft``); whether the batches
    are packed is decided from the dataset itself (see ``tune.data.collate_for_dataset``), and the function gets
    the padding id, ignore index and max_seq_len its signature takes. A node with ``_component_`` builds a
    collator class with its keyword arguments, used as it is.

    Args:
        cfg_collate (Any): the ``collate_fn`` value: a string, a component node, or ``None`` for the default
            (``tune.data.padding_free_collate`` on CPU, ``tune.data.padded_collate_sft`` elsewhere; for pairs
            ``tune.data.padding_free_collate_dpo`` on CPU, ``tune.data.padded_collate_dpo`` elsewhere).
        dataset (Any): the dataset the batches come from.
        padding_idx (int): the tokenizer's pad id.
        ignore_idx (int): the label that gets no loss.
        max_seq_len (int | None): the model's maximum sequence length (for padding-free rows).
        device_type (str): where training runs; on CPU a padded collator gets a hint about padding-free rows.
        pairs (bool): the samples are preference pairs (the preference recipes). Default False.
        padding_free (bool): whether the run can take padding-free rows of pairs: False under context
            parallelism, which cuts padded rows (the default is then padded, and ``padding_free_collate_dpo`` is
            refused). Default True.

    Returns:
        Callable[..., Any]: the collate function for a ``DataLoader``.

    Raises:
        ConfigError: at ``collate_fn`` when the collator does not fit the dataset.
    """
    from tune import data

    if isinstance(cfg_collate, (DictConfig, dict)):
        return instantiate(cfg_collate)  # a collator class configured by keyword arguments
    name = cfg_collate
    if name is None:  # DEFAULT_NOTES["collate_fn"]: the same losses either way, no compute on padding on CPU
        free = device_type == "cpu" and padding_free
        if pairs:
            name = "tune.data.padding_free_collate_dpo" if free else "tune.data.padded_collate_dpo"
        else:
            name = "tune.data.padding_free_collate" if device_type == "cpu" else "tune.data.padded_collate_sft"
        log.info("collate_fn: null -> %s on %s (set collate_fn to choose).", name, device_type)
    function = get_component_from_path(name, "collate_fn")
    if function is data.padding_free_collate_dpo and not padding_free:
        raise ConfigError(
            [
                ConfigProblem(
                    "collate_fn", "context parallelism cuts padded rows; use tune.data.padded_collate_dpo", name
                )
            ]
        )
    with errors_at("collate_fn", name):
        collate = data.collate_for_dataset(
            function, dataset, padding_idx=padding_idx, ignore_idx=ignore_idx, max_seq_len=max_seq_len
        )
    if device_type == "cpu" and function is data.padded_collate_dpo and cfg_collate is not None and padding_free:
        log.info(
            "CPU: collate_fn=tune.data.padding_free_collate_dpo puts each batch of pairs in one row (same losses)."
        )
    if device_type == "cpu" and function is data.padded_collate_sft and cfg_collate is not None:
        log.info(
            "CPU: collate_fn=tune.data.padding_free_collate puts each batch in one row without padding (same "
            "losses, no compute spent on padding)."
        )
    return collate


def _parameters(component: Any) -> Sequence[str]:
    try:
        return list(inspect.signature(component).parameters)
    except (TypeError, ValueError):
        return []
