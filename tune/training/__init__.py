"""Training components shared by every recipe: loss normalisation, LR schedules, metric loggers, precision, seed,
memory, activation checkpointing/offloading, compile, profiler, throughput, and FSDP2 helpers.

Checkpointers live in ``tune.training.checkpointing`` and are also reachable here
(``tune.training.FullModelHFCheckpointer``), as in torchtune.
"""

import importlib
from typing import Any

from tune.modules.loss import shift_labels
from tune.training._adapters import load_lora_state_dicts, lora_checkpoint_payload, prepare_lora_model
from tune.training._batch import MODEL_INPUT_KEYS, batch_to_device, model_inputs
from tune.training._compile import compile_loss, compile_model
from tune.training._context_parallel import ContextParallel, check_context_parallel
from tune.training._distillation import (
    check_kd_ratio,
    check_same_vocabulary,
    distillation_loss,
    model_vocab_size,
    prepare_kd_ce_loss,
    prepare_kd_loss,
    prepare_teacher,
)
from tune.training._distributed import (
    all_reduce_max,
    all_reduce_sum,
    errors_on_all_ranks,
    gather_cpu_state_dict,
    get_distributed_backend,
    get_full_optimizer_state_dict,
    get_shard_conditions,
    init_adapters,
    init_distributed,
    is_distributed,
    load_from_full_model_state_dict,
    load_from_full_optimizer_state_dict,
    set_torch_num_threads,
    shard_model,
    sync_seed,
    validate_no_params_on_meta_device,
)
from tune.training._expert_parallel import apply_expert_parallel, init_expert_parallel_mesh
from tune.training._finetuning_schedule import FinetuningSchedule, auto_finetuning_phases
from tune.training._grad import FiniteLossCheck, NonFiniteLossError, check_loss_is_finite, clip_grad_norm
from tune.training._loss_scaling import (
    LossTokenCounter,
    NoLossTokensError,
    num_loss_tokens,
    scale_grads,
    step_loss_scale,
)
from tune.training._memory_estimate import (
    CPU_ALLOCATOR_OVERHEAD,
    CPU_PROCESS_BASELINE_BYTES,
    CUDA_CONTEXT_BYTES,
    FrozenModel,
    MemoryEstimate,
    estimate_memory,
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
from tune.training._model_util import disable_dropout
from tune.training._moe import RouterAuxLoss
from tune.training._parallel import (
    ParallelDims,
    apply_tensor_parallel,
    context_parallel_size,
    data_parallel_rank_and_size,
    family_shard_conditions,
    family_tensor_parallel_plan,
    fsdp_mesh,
    init_device_mesh,
    prepare_mha_for_tp,
    tensor_parallel_size,
)
from tune.training._profiler import (
    DEFAULT_PROFILE_DIR,
    DEFAULT_PROFILER_ACTIVITIES,
    DEFAULT_SCHEDULE,
    DEFAULT_TRACE_OPTS,
    PROFILER_KEY,
    DummyProfiler,
    setup_torch_profiler,
)
from tune.training._recipe_state import (
    FINETUNING_SCHEDULE_KEY,
    RecipeState,
    activation_offloading_context,
    prepare_loss,
    progress_state,
    restore_progress,
    step_metrics,
    steps_per_epoch,
    validation_loss,
)
from tune.training._report import (
    RUN_INFO_FILE,
    RunLog,
    RunLogError,
    read_run_log,
    read_run_logs,
    render_report,
    write_report,
)
from tune.training._sharded_state import (
    DCP_SUBDIR,
    PROGRESS_KEY,
    ShardedRecipeState,
    load_sharded_checkpoint,
    mean_over_ranks,
    save_sharded_checkpoint,
    saved_optimizer_state,
    sharded_model_state,
    sharded_optimizer_state,
)
from tune.training._throughput import ThroughputTracker, count_tokens, get_progress_bar
from tune.training.activations import (
    NoOpManager,
    OffloadActivations,
    activation_offloading_supported,
    apply_activation_checkpointing,
    apply_selective_activation_checkpointing,
    get_act_offloading_ctx_manager,
    set_activation_checkpointing,
)
from tune.training.lr_schedulers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
    get_lr,
)
from tune.training.memory import (
    OptimizerInBackward,
    OptimizerInBackwardWrapper,
    cleanup_before_training,
    configure_cpu_allocator,
    create_optim_in_bwd_wrapper,
    get_memory_stats,
    log_memory_stats,
    register_optim_in_bwd_hooks,
    reset_peak_memory_stats,
)
from tune.training.metric_logging import (
    CometLogger,
    DiskLogger,
    MetricLoggerInterface,
    MLFlowLogger,
    StdoutLogger,
    TensorBoardLogger,
    WandBLogger,
)
from tune.training.pooling import get_unmasked_sequence_lengths
from tune.training.precision import get_dtype, set_default_dtype, validate_expected_param_dtype
from tune.training.quantization import get_quantizer_mode
from tune.training.seed import set_seed
from tune.utils import get_world_size_and_rank

__all__ = [
    "CPU_ALLOCATOR_OVERHEAD",
    "CPU_PROCESS_BASELINE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "ContextParallel",
    "FrozenModel",
    "MemoryEstimate",
    "estimate_memory",
    "RecipeState",
    "sharded_optimizer_state",
    "sharded_model_state",
    "save_sharded_checkpoint",
    "load_sharded_checkpoint",
    "prepare_lora_model",
    "lora_checkpoint_payload",
    "load_lora_state_dicts",
    "saved_optimizer_state",
    "mean_over_ranks",
    "ShardedRecipeState",
    "ParallelDims",
    "PROGRESS_KEY",
    "DCP_SUBDIR",
    "CometLogger",
    "DEFAULT_PROFILER_ACTIVITIES",
    "DEFAULT_PROFILE_DIR",
    "DEFAULT_SCHEDULE",
    "DEFAULT_TRACE_OPTS",
    "DiskLogger",
    "DummyProfiler",
    "FINETUNING_SCHEDULE_KEY",
    "FakeQuantizedLoRALinear",
    "FinetuningSchedule",
    "FiniteLossCheck",
    "Float8TrainingConverter",
    "Int8DynActInt4WeightQATConverter",
    "LoRAConverter",
    "LossTokenCounter",
    "MLFlowLogger",
    "MetricLoggerInterface",
    "ModelConverter",
    "NoLossTokensError",
    "NoOpManager",
    "NonFiniteLossError",
    "OffloadActivations",
    "OptimizerInBackward",
    "OptimizerInBackwardWrapper",
    "PROFILER_KEY",
    "QATConverter",
    "RouterAuxLoss",
    "StdoutLogger",
    "TensorBoardLogger",
    "ThroughputTracker",
    "RUN_INFO_FILE",
    "RunLog",
    "RunLogError",
    "read_run_log",
    "read_run_logs",
    "render_report",
    "write_report",
    "WandBLogger",
    "activation_offloading_context",
    "activation_offloading_supported",
    "all_reduce_max",
    "all_reduce_sum",
    "apply_activation_checkpointing",
    "apply_expert_parallel",
    "apply_model_converters",
    "apply_selective_activation_checkpointing",
    "apply_tensor_parallel",
    "check_context_parallel",
    "context_parallel_size",
    "auto_finetuning_phases",
    "check_kd_ratio",
    "check_loss_is_finite",
    "check_same_vocabulary",
    "cleanup_before_training",
    "clip_grad_norm",
    "compile_loss",
    "compile_model",
    "configure_cpu_allocator",
    "batch_to_device",
    "count_tokens",
    "create_optim_in_bwd_wrapper",
    "data_parallel_rank_and_size",
    "fsdp_mesh",
    "disable_dropout",
    "distillation_loss",
    "errors_on_all_ranks",
    "family_shard_conditions",
    "family_tensor_parallel_plan",
    "gather_cpu_state_dict",
    "get_act_offloading_ctx_manager",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_distributed_backend",
    "get_dtype",
    "get_full_optimizer_state_dict",
    "get_linear_schedule_with_warmup",
    "get_lr",
    "get_memory_stats",
    "get_progress_bar",
    "get_quantizer_mode",
    "get_shard_conditions",
    "get_unmasked_sequence_lengths",
    "get_world_size_and_rank",
    "init_adapters",
    "init_device_mesh",
    "init_distributed",
    "init_expert_parallel_mesh",
    "is_distributed",
    "load_from_full_model_state_dict",
    "load_from_full_optimizer_state_dict",
    "log_memory_stats",
    "model_inputs",
    "model_vocab_size",
    "MODEL_INPUT_KEYS",
    "num_loss_tokens",
    "prepare_kd_ce_loss",
    "prepare_kd_loss",
    "prepare_loss",
    "prepare_mha_for_tp",
    "prepare_teacher",
    "progress_state",
    "register_optim_in_bwd_hooks",
    "register_post_optimizer_hooks",
    "reset_peak_memory_stats",
    "restore_progress",
    "scale_grads",
    "set_activation_checkpointing",
    "set_default_dtype",
    "set_seed",
    "set_torch_num_threads",
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
    "validate_no_params_on_meta_device",
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
