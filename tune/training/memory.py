"""torchtune's ``training.memory`` module path: memory statistics, the optimizer in backward, activation
checkpointing."""

from tune.training._activations import set_activation_checkpointing
from tune.training._memory import (
    OptimizerInBackward,
    OptimizerInBackwardWrapper,
    cleanup_before_training,
    create_optim_in_bwd_wrapper,
    get_memory_stats,
    log_memory_stats,
    register_optim_in_bwd_hooks,
    reset_peak_memory_stats,
)

DEFAULT_LOG_MESSAGE = "Memory stats after model init:"

__all__ = [
    "DEFAULT_LOG_MESSAGE",
    "OptimizerInBackward",
    "OptimizerInBackwardWrapper",
    "cleanup_before_training",
    "create_optim_in_bwd_wrapper",
    "get_memory_stats",
    "log_memory_stats",
    "register_optim_in_bwd_hooks",
    "reset_peak_memory_stats",
    "set_activation_checkpointing",
]
