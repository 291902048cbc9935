"""Activation memory: checkpointing (recompute in backward) and offloading (park on CPU until backward).

Both are applied from outside the model: checkpointing wraps the ``forward`` of chosen submodules, offloading
is a context manager around the forward pass. Module names and state-dict keys are left unchanged.
"""

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

WrapPolicy = set[type] | Callable[[nn.Module, bool, int], bool] | Callable[[nn.Module], bool]


def _matches(policy: Any, module: nn.Module) -> bool:
    if isinstance(policy, (set, frozenset, list, tuple)):
        return isinstance(module, tuple(policy))
    if isinstance(policy, type):
        return isinstance(module, policy)
    if len(inspect.signature(policy).parameters) >= 3:
        # the torch auto-wrap-policy signature: (module, recurse, nonwrapped_numel)
        return bool(policy(module, False, 0))
    return bool(policy(module))


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return self._forward_without_checkpoint(*args, **kwargs)  # eval/generation: nothing to save
    return checkpoint(self._forward_without_checkpoint, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, auto_wrap_policy: WrapPolicy) -> int:
    """Makes matching submodules recompute their activations during backward instead of storing them.

    Uses non-reentrant ``torch.utils.checkpoint``: only each module's inputs are kept, and its forward is run
    again in backward. The module's ``forward`` is wrapped in place, so parameter names and state-dict keys do
    not change (checkpointers, LoRA helpers and FSDP shard rules see the same names). A module inside an
    already checkpointed one is skipped (nesting would recompute twice).

    Args:
        model (nn.Module): the model, before sharding and compile.
        auto_wrap_policy (set[type] | Callable): module classes to checkpoint (e.g.
            ``{TransformerSelfAttentionLayer}``), or a predicate ``module -> bool`` (torch's
            ``(module, recurse, nonwrapped_numel) -> bool`` auto-wrap signature also works).

    Returns:
        int: how many modules were wrapped.

    Raises:
        ValueError: if the policy matches no submodule.
    """
    wrapped_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in wrapped_prefixes) or not _matches(auto_wrap_policy, module):
            continue
        if getattr(module, "_forward_without_checkpoint", None) is None:
            # bound methods, so copy.deepcopy rebinds them to the copy
            module._forward_without_checkpoint = module.forward
            module.forward = types.MethodType(_checkpointed_forward, module)
        wrapped_prefixes.append(name)
    if not wrapped_prefixes:
        raise ValueError(
            f"Activation checkpointing matched no module of {type(model).__name__} with policy {auto_wrap_policy!r}. "
            "Pass the model's layer class (e.g. {TransformerSelfAttentionLayer}) or a predicate that selects them."
        )
    return len(wrapped_prefixes)


def activation_offloading_supported(device: torch.device | str) -> tuple[bool, str]:
    """Whether activation offloading can save memory on ``device``, and why not if it cannot.

    Args:
        device (torch.device | str): the training device.

    Returns:
        tuple[bool, str]: ``(supported, reason)``; the reason is a sentence a recipe can log as is.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return True, "activations are copied to pinned CPU memory during forward and back during backward"
    if device.type == "cpu":
        return False, (
            "enable_activation_offloading has no effect on CPU: activations already live in host memory, "
            "there is nowhere cheaper to move them. Use enable_activation_checkpointing to save memory instead."
        )
    return False, f"activation offloading needs a CUDA device; it is not available on {device.type!r}."


def _is_parameter_like(tensor: torch.Tensor) -> bool:
    # weights saved for backward (or their transposed views) stay resident anyway: copying them wastes bandwidth
    base = tensor._base if tensor._base is not None else tensor
    return isinstance(tensor, nn.Parameter) or isinstance(base, nn.Parameter)


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """Moves tensors saved for backward to CPU during forward and brings them back when backward needs them.

    Use around the forward pass: ``with OffloadActivations(): loss = loss_fn(model(tokens), labels)``. Trades
    host-device bandwidth for accelerator memory, and pairs well with activation checkpointing (then only the
    checkpointed layers' inputs are saved, and those get offloaded). Tensors already on CPU, parameters and
    tensors smaller than ``min_offload_bytes`` stay where they are, so on a CPU-only run this is a no-op: check
    :func:`activation_offloading_supported` and tell the user.

    Args:
        use_pin_memory (bool): copy into pinned host memory, which makes the device-to-host copies
            asynchronous.
        min_offload_bytes (int): tensors smaller than this stay on the device (the copy overhead outweighs
            the saving).
    """

    def __init__(self, use_pin_memory: bool = True, min_offload_bytes: int = 1024) -> None:
        self.use_pin_memory = use_pin_memory
        self.min_offload_bytes = min_offload_bytes
        self.num_offloaded = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.device | None, torch.Tensor]:
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.device.type == "cpu" or nbytes < self.min_offload_bytes or _is_parameter_like(tensor):
            return None, tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=self.use_pin_memory)
        # same-stream copy: the source cannot be reused by the allocator before the copy has run
        host.copy_(tensor, non_blocking=self.use_pin_memory)
        self.num_offloaded += 1
        return tensor.device, host

    @staticmethod
    def _unpack(packed: tuple[torch.device | None, torch.Tensor]) -> torch.Tensor:
        device, tensor = packed
        if device is None:
            return tensor
        return tensor.to(device, non_blocking=True)
