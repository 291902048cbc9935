"""Training components shared by every recipe: loss normalisation, LR schedules, metric loggers, precision, seed,
memory, activation checkpointing/offloading, compile, profiler, throughput, and FSDP2 helpers.

Checkpointers live in ``tune.training.checkpointing`` and are also reachable here
(``tune.training.FullModelHFCheckpointer``), as in torchtune.
"""

import importlib
from typing import Any

from tune.modules.loss import shift_labels
from tune.training._activations import (
    OffloadActivations,
    activation_offloading_supported,
    apply_activation_checkpointing,
)
from tune.training._compile import compile_loss, compile_model
from tune.training._distributed import (
    all_reduce_sum,
    errors_on_all_ranks,
    gather_cpu_state_dict,
    init_adapters,
    init_distributed,
    is_distributed,
    load_from_full_model_state_dict,
    shard_model,
    sync_seed,
)
from tune.training._finetuning_schedule import FinetuningSchedule, auto_finetuning_phases
from tune.training._grad import FiniteLossCheck, NonFiniteLossError, check_loss_is_finite, clip_grad_norm
from tune.training._loss_scaling import num_loss_tokens, scale_grads, step_loss_scale
from tune.training._memory import (
    OptimizerInBackward,
    configure_cpu_allocator,
    get_memory_stats,
    reset_peak_memory_stats,
)
from tune.training._model_converters import (
    FakeQuantizedLoRALinear,
    Float8TrainingConverter,
    Int8DynActInt4WeightQATConverter,
    LoRAConverter,
    ModelConverter,
    QATConverter,
    apply_model_converters,
    register_post_optimizer_hooks,
    validate_converter_order,
)
from tune.training._parallel import (
    apply_tensor_parallel,
    data_parallel_rank_and_size,
    family_shard_conditions,
    family_tensor_parallel_plan,
    init_device_mesh,
    tensor_parallel_size,
)
from tune.training._precision import get_dtype, set_default_dtype, validate_expected_param_dtype
from tune.training._profiler import DummyProfiler, setup_torch_profiler
from tune.training._recipe_state import (
    FINETUNING_SCHEDULE_KEY,
    activation_offloading_context,
    prepare_loss,
    progress_state,
    restore_progress,
    step_metrics,
    steps_per_epoch,
    validation_loss,
)
from tune.training._seed import set_seed
from tune.training._throughput import ThroughputTracker, count_tokens, get_progress_bar
from tune.training.lr_schedulers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
    get_lr,
)
from tune.training.metric_logging import (
    DiskLogger,
    MetricLoggerInterface,
    StdoutLogger,
    TensorBoardLogger,
    WandBLogger,
)

__all__ = [
    "DiskLogger",
    "DummyProfiler",
    "FINETUNING_SCHEDULE_KEY",
    "FakeQuantizedLoRALinear",
    "FinetuningSchedule",
    "FiniteLossCheck",
    "Float8TrainingConverter",
    "Int8DynActInt4WeightQATConverter",
    "LoRAConverter",
    "MetricLoggerInterface",
    "ModelConverter",
    "NonFiniteLossError",
    "OffloadActivations",
    "OptimizerInBackward",
    "QATConverter",
    "StdoutLogger",
    "TensorBoardLogger",
    "ThroughputTracker",
    "WandBLogger",
    "activation_offloading_context",
    "activation_offloading_supported",
    "all_reduce_sum",
    "apply_activation_checkpointing",
    "apply_model_converters",
    "apply_tensor_parallel",
    "auto_finetuning_phases",
    "check_loss_is_finite",
    "clip_grad_norm",
    "compile_loss",
    "compile_model",
    "configure_cpu_allocator",
    "count_tokens",
    "data_parallel_rank_and_size",
    "errors_on_all_ranks",
    "family_shard_conditions",
    "family_tensor_parallel_plan",
    "gather_cpu_state_dict",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_dtype",
    "get_linear_schedule_with_warmup",
    "get_lr",
    "get_memory_stats",
    "get_progress_bar",
    "init_adapters",
    "init_device_mesh",
    "init_distributed",
    "is_distributed",
    "load_from_full_model_state_dict",
    "num_loss_tokens",
    "prepare_loss",
    "progress_state",
    "register_post_optimizer_hooks",
    "reset_peak_memory_stats",
    "restore_progress",
    "scale_grads",
    "set_default_dtype",
    "set_seed",
    "setup_torch_profiler",
    "shard_model",
    "shift_labels",
    "step_loss_scale",
    "step_metrics",
    "steps_per_epoch",
    "sync_seed",
    "tensor_parallel_size",
    "validate_converter_order",
    "validate_expected_param_dtype",
    "validation_loss",
]


def __getattr__(name: str) -> Any:
    # checkpointers (tune.training.checkpointing, its own subpackage) under their torchtune paths, imported lazily
    if not name.startswith("_"):
        try:
            checkpointing = importlib.import_module("tune.training.checkpointing")
        except ModuleNotFoundError as err:
            if err.name != "tune.training.checkpointing":
                raise
        else:
            if name in getattr(checkpointing, "__all__", ()):
                return getattr(checkpointing, name)
    raise AttributeError(f"module 'tune.training' has no attribute {name!r}")
