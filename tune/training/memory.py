"""Memory: peak-usage statistics, the CPU allocator, and the optimizer run inside backward (``optimizer_in_bwd``).

``set_activation_checkpointing`` (from ``tune.training.activations``) is importable here too, as in torchtune.
"""

import ctypes
import ctypes.util
import gc
import os
import platform
import resource
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from tune.training.activations import set_activation_checkpointing
from tune.utils import get_logger, log_rank_zero

__all__ = [
    "DEFAULT_LOG_MESSAGE",
    "OptimizerInBackward",
    "OptimizerInBackwardWrapper",
    "cleanup_before_training",
    "configure_cpu_allocator",
    "create_optim_in_bwd_wrapper",
    "get_memory_stats",
    "log_memory_stats",
    "register_optim_in_bwd_hooks",
    "reset_peak_memory_stats",
    "set_activation_checkpointing",
]

_log = get_logger(name=__name__)

_GIB = 1024**3

# the first line log_memory_stats writes by default (torchtune's name for it)
DEFAULT_LOG_MESSAGE = "Memory stats after model init:"


def _proc_status_bytes(field: str) -> int | None:
    # /proc/self/status (Linux) reports VmRSS and VmHWM (its peak) in kB, from the same counters
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_memory() -> tuple[int, int]:
    """(current, peak) resident set size in bytes."""
    current, peak = _proc_status_bytes("VmRSS"), _proc_status_bytes("VmHWM")
    if current is None or peak is None:  # no /proc (macOS): getrusage gives the peak only
        ru_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = ru_peak if sys.platform == "darwin" else ru_peak * 1024  # macOS reports bytes, Linux KiB
        current = peak if current is None else current
    return current, max(current, peak)


# glibc's malloc hands out a block above its mmap threshold (128 KiB at start, raised as such blocks are freed, up to
# 32 MiB) as fresh pages from the kernel and unmaps it on free, and returns free memory at the top of the heap to the
# kernel once it exceeds the trim threshold. A training step on CPU allocates and frees tens to hundreds of MB of
# activations every step, in sizes that change from step to step, so both rules keep giving pages back that the next
# step faults in and has the kernel zero again (benchmarks/README.md has the page faults measured). With both
# thresholds fixed high, such blocks stay in the heap and the next step reuses them. Peak memory is the same: what is
# kept is what the previous step used.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_MMAP_THRESHOLD = 32 * 1024**2  # the largest value glibc accepts on 64-bit
_TRIM_THRESHOLD = 2**31 - 1


def configure_cpu_allocator() -> bool:
    """Makes glibc's malloc reuse large freed blocks instead of returning them to the kernel.

    For training on CPU, called once by the recipes. Does nothing outside Linux with glibc, or when the environment
    sets ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_TOP_PAD_`` (the user's own tuning wins),
    or ``TUNE_CPU_ALLOCATOR=0``. Memory that a step frees stays with the process for the next step instead of
    being returned to the kernel, so the resident size stays at its peak rather than dropping between steps.

    Returns:
        bool: whether the allocator settings were changed.
    """
    if os.environ.get("TUNE_CPU_ALLOCATOR", "1") == "0":
        return False
    if any(f"MALLOC_{name}_" in os.environ for name in ("MMAP_THRESHOLD", "TRIM_THRESHOLD", "TOP_PAD")):
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1


def get_memory_stats(device: torch.device | str, reset_stats: bool = True) -> dict[str, float]:
    """Peak memory of this process on ``device``, in GiB.

    On CUDA: ``peak_memory_active`` (peak bytes held by live tensors), ``peak_memory_alloc``
    (``max_memory_allocated``) and ``peak_memory_reserved`` (``max_memory_reserved``, what the caching allocator
    took from the driver), since the last reset. On CPU: ``peak_memory_rss`` (peak resident set size of the
    process since the last reset, or since it started) and ``memory_rss`` (now). Reading CUDA statistics does
    not synchronise the device.

    Args:
        device (torch.device | str): the training device.
        reset_stats (bool): after reading, start a new peak window (:func:`reset_peak_memory_stats`), so the next
            call reports the peak since this one, as in torchtune. Default True; pass False for the peak of the
            whole run.

    Returns:
        dict[str, float]: the statistics.

    Raises:
        ValueError: for a device type without memory statistics here (e.g. ``meta``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        result = {
            "peak_memory_active": stats.get("active_bytes.all.peak", 0) / _GIB,
            "peak_memory_alloc": torch.cuda.max_memory_allocated(device) / _GIB,
            "peak_memory_reserved": torch.cuda.max_memory_reserved(device) / _GIB,
        }
    elif device.type in ("cpu", "mps"):
        current, peak = _cpu_memory()
        result = {"peak_memory_rss": peak / _GIB, "memory_rss": current / _GIB}
    else:
        raise ValueError(f"No memory statistics for device type {device.type!r}; use a cpu, cuda or mps device.")
    if reset_stats:
        reset_peak_memory_stats(device)
    return result


def log_memory_stats(stats: Mapping[str, float], message: str = DEFAULT_LOG_MESSAGE) -> None:
    """Logs the statistics of :func:`get_memory_stats` (in GiB) on rank 0, one per line after ``message``.

    Args:
        stats (Mapping[str, float]): what :func:`get_memory_stats` returned.
        message (str): the first line. Default ``"Memory stats after model init:"``.
    """
    lines = "".join(f"\n\t{name.replace('_', ' ')}: {value:.2f} GiB" for name, value in stats.items())
    log_rank_zero(_log, f"{message}{lines}")


def cleanup_before_training() -> None:
    """Frees what model building left behind before the first step: runs the garbage collector, returns cached
    accelerator memory to the driver and starts a new peak-memory window."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_memory_stats("cpu")


def reset_peak_memory_stats(device: torch.device | str) -> bool:
    """Starts a new peak-memory window, so the next :func:`get_memory_stats` reports the peak since now.

    On CUDA this resets the allocator's peaks. On Linux CPU it resets the process's peak RSS (writing ``5`` to
    ``/proc/self/clear_refs``, Linux >= 4.0); elsewhere the CPU peak covers the whole process lifetime.

    Args:
        device (torch.device | str): the training device.

    Returns:
        bool: whether the peak was reset.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class OptimizerInBackward(Optimizer):
    """Steps the optimizer for each parameter as soon as its gradient is ready, then frees that gradient.

    Gradients of the whole model never coexist, which saves up to one model's worth of gradient memory. It is
    an ``Optimizer`` whose ``param_groups`` are those of the per-parameter optimizers, so LR schedulers and
    ``get_lr`` work unchanged; ``step()`` and ``zero_grad()`` are no-ops (the work happened during backward), so
    a recipe's loop needs no special case. ``state_dict()``/``load_state_dict()`` key the per-parameter states
    by parameter name.

    Limits, checked by :meth:`check_compatible`: no gradient clipping (a clipping factor needs the norm of
    every gradient before any step, but here each parameter has stepped before the others' gradients exist),
    and no gradient accumulation (each backward steps immediately). The loss must be scaled *before*
    ``backward`` (``loss_sum * step_loss_scale(num_tokens)``), never with ``scale_grads`` after it.

    Args:
        named_params (Iterable[tuple[str, nn.Parameter]]): e.g. ``model.named_parameters()``; parameters that do
            not require grad are skipped.
        optimizer_factory (Callable[..., Optimizer]): an optimizer class (``torch.optim.AdamW``) or any callable
            taking ``(params, **optimizer_kwargs)``.
        **optimizer_kwargs: passed to ``optimizer_factory`` (``lr``, ``weight_decay``, ...).

    Raises:
        ValueError: if no parameter requires grad.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, nn.Parameter]],
        optimizer_factory: Callable[..., Optimizer],
        **optimizer_kwargs: Any,
    ) -> None:
        trainable = [(name, param) for name, param in named_params if param.requires_grad]
        if not trainable:
            raise ValueError("OptimizerInBackward got no parameter that requires grad; nothing to optimize.")
        self.optimizers: dict[str, Optimizer] = {
            name: optimizer_factory([param], **optimizer_kwargs) for name, param in trainable
        }
        super().__init__([param for _, param in trainable], defaults={})
        # share the inner optimizers' group dicts: a scheduler writing `lr` here writes it there
        self.param_groups = [group for opt in self.optimizers.values() for group in opt.param_groups]
        self._handles = [
            param.register_post_accumulate_grad_hook(self._make_hook(self.optimizers[name]))
            for name, param in trainable
        ]

    @staticmethod
    def _make_hook(optimizer: Optimizer) -> Callable[[torch.Tensor], None]:
        def step_and_free(param: torch.Tensor) -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step_and_free

    @staticmethod
    def check_compatible(clip_grad_norm: float | None = None, gradient_accumulation_steps: int = 1) -> None:
        """Refuses settings that cannot work when the optimizer steps inside backward.

        Args:
            clip_grad_norm (float | None): the recipe's gradient-clipping threshold.
            gradient_accumulation_steps (int): the recipe's accumulation steps.

        Raises:
            ValueError: if clipping is on or accumulation is above 1, saying which config key to change.
        """
        problems = []
        if clip_grad_norm is not None:
            problems.append(
                f"clip_grad_norm={clip_grad_norm}: clipping needs every gradient's norm before any parameter "
                "steps, but with optimizer_in_bwd each parameter steps as soon as its own gradient exists"
            )
        if gradient_accumulation_steps != 1:
            problems.append(
                f"gradient_accumulation_steps={gradient_accumulation_steps}: each backward pass already "
                "stepped the optimizer, so gradients cannot accumulate"
            )
        if problems:
            raise ValueError(
                "optimizer_in_bwd=True cannot be combined with " + "; and ".join(problems) + ". Set "
                "`optimizer_in_bwd: False`, or `clip_grad_norm: null` and `gradient_accumulation_steps: 1`."
            )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        """No-op: each parameter stepped during backward. Kept so recipe loops need no special case."""
        if closure is not None:
            raise ValueError("OptimizerInBackward cannot take a closure: it steps inside backward.")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: each gradient was freed right after its step."""

    def state_dict(self) -> dict[str, Any]:
        """Per-parameter optimizer states, keyed by parameter name."""
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores states saved by :meth:`state_dict`.

        Args:
            state_dict (Mapping[str, Any]): parameter name -> optimizer state dict.

        Raises:
            ValueError: if the names differ from this optimizer's parameters.
        """
        missing = sorted(set(self.optimizers) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(self.optimizers))
        if missing or unexpected:
            raise ValueError(
                f"Optimizer state does not match the trainable parameters: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}. Was it saved with the same model and the same trainable parameters?"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state_dict[name])
        # loading replaces each inner optimizer's group dicts: share the new ones
        self.param_groups = [group for opt in self.optimizers.values() for group in opt.param_groups]

    def remove_hooks(self) -> None:
        """Detaches the backward hooks; afterwards backward leaves gradients in ``.grad`` as usual."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


class OptimizerInBackwardWrapper:
    """torchtune's handle on optimizers that step inside backward (one optimizer per parameter, see
    :func:`register_optim_in_bwd_hooks`): checkpointing by parameter name and an LR scheduler for all of them.

    tune's recipes use :class:`OptimizerInBackward` instead, a real ``Optimizer`` that needs none of this; the
    wrapper is for loops written against torchtune. Single-device only.

    Args:
        optim_map (dict[str, Optimizer]): parameter name -> the optimizer of that parameter.
    """

    def __init__(self, optim_map: dict[str, Optimizer]) -> None:
        self.optim_map = optim_map
        self.lr_scheduler: LRScheduler | None = None

    def state_dict(self) -> dict[str, Any]:
        """Each parameter's optimizer state, keyed by parameter name."""
        return {name: opt.state_dict() for name, opt in self.optim_map.items()}

    def load_state_dict(self, optim_ckpt_map: Mapping[str, Any]) -> None:
        """Restores states saved by :meth:`state_dict`.

        Args:
            optim_ckpt_map (Mapping[str, Any]): parameter name -> optimizer state dict.

        Raises:
            RuntimeError: if a name is not one of this wrapper's parameters, or a parameter has no state.
        """
        unexpected = sorted(set(optim_ckpt_map) - set(self.optim_map))
        missing = sorted(set(self.optim_map) - set(optim_ckpt_map))
        if unexpected or missing:
            raise RuntimeError(
                f"Optimizer state does not match the parameters: unexpected {unexpected[:5]}, missing {missing[:5]}."
            )
        for name, opt in self.optim_map.items():
            opt.load_state_dict(optim_ckpt_map[name])

    def get_optim_key(self, key: str) -> Any:
        """The hyperparameter ``key`` (``"lr"``, ...) of the first parameter group of the first optimizer; all
        optimizers are assumed to share it."""
        return next(iter(self.optim_map.values())).param_groups[0][key]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The first parameter group of every per-parameter optimizer (what :func:`get_lr` reads)."""
        return [opt.param_groups[0] for opt in self.optim_map.values()]

    def set_lr_scheduler(self, lr_scheduler: LRScheduler) -> None:
        """Makes ``lr_scheduler.step()`` also copy the new learning rate into every per-parameter optimizer.

        Args:
            lr_scheduler (LRScheduler): a scheduler built on any one of the optimizers (or a stand-in one).
        """
        self.lr_scheduler = lr_scheduler
        scheduler_step = lr_scheduler.step

        def step_all(epoch: int | None = None) -> None:
            scheduler_step() if epoch is None else scheduler_step(epoch)
            lr = lr_scheduler.get_last_lr()[0]
            for opt in self.optim_map.values():
                for group in opt.param_groups:
                    group["lr"] = lr

        lr_scheduler.step = step_all

    def step_lr_scheduler(self, epoch: int | None = None) -> None:
        """Steps the scheduler set with :meth:`set_lr_scheduler`.

        Raises:
            RuntimeError: if no scheduler was set.
        """
        self._scheduler().step(epoch)

    def get_last_lr(self) -> float:
        """The scheduler's current learning rate.

        Raises:
            RuntimeError: if no scheduler was set.
        """
        return self._scheduler().get_last_lr()[0]

    def _scheduler(self) -> LRScheduler:
        if self.lr_scheduler is None:
            raise RuntimeError("No LR scheduler on this OptimizerInBackwardWrapper: call set_lr_scheduler first.")
        return self.lr_scheduler


def create_optim_in_bwd_wrapper(
    model: nn.Module, optim_dict: Mapping[nn.Parameter, Optimizer]
) -> OptimizerInBackwardWrapper:
    """Names the per-parameter optimizers of ``optim_dict`` by ``model``'s parameter names.

    Args:
        model (nn.Module): the model whose parameters ``optim_dict`` covers.
        optim_dict (Mapping[nn.Parameter, Optimizer]): parameter -> its optimizer.

    Returns:
        OptimizerInBackwardWrapper: the wrapper, for checkpointing and the LR schedule.
    """
    return OptimizerInBackwardWrapper({name: optim_dict[p] for name, p in model.named_parameters() if p in optim_dict})


def register_optim_in_bwd_hooks(model: nn.Module, optim_dict: Mapping[nn.Parameter, Optimizer]) -> None:
    """Makes each trainable parameter's optimizer step, and free the gradient, as soon as backward has
    accumulated that gradient.

    Args:
        model (nn.Module): the model; every parameter that requires grad gets a hook.
        optim_dict (Mapping[nn.Parameter, Optimizer]): parameter -> its optimizer (one per parameter).
    """

    def step_and_free(param: torch.Tensor) -> None:
        optim_dict[param].step()
        optim_dict[param].zero_grad()

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(step_and_free)
