"""Activation memory: checkpointing (recompute in backward) and offloading (park on CPU until backward).

Both are applied from outside the model: checkpointing wraps the ``forward`` of chosen submodules, offloading
is a context manager around the forward pass. Module names and state-dict keys are left unchanged.
"""

import contextlib
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "NoOpManager",
    "OffloadActivations",
    "WrapPolicy",
    "activation_offloading_supported",
    "apply_activation_checkpointing",
    "apply_selective_activation_checkpointing",
    "get_act_offloading_ctx_manager",
    "set_activation_checkpointing",
]

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
    tensors smaller than ``min_offload_size`` bytes stay where they are, so on a CPU-only run this is a no-op:
    check :func:`activation_offloading_supported` and tell the user.

    Copies run on the compute stream: ``use_streams`` and ``max_fwd_stash_size`` (torchtune's separate copy stream
    and the number of tensors it keeps alive while their copies are in flight) are accepted and have no effect.

    Args:
        use_pin_memory (bool): copy into pinned host memory, which makes the device-to-host copies
            asynchronous. Default True.
        use_streams (bool): accepted for torchtune compatibility; no effect. Default True.
        max_fwd_stash_size (int): accepted for torchtune compatibility; no effect. Default 5.
        min_offload_size (int): tensors smaller than this many bytes stay on the device (the copy overhead
            outweighs the saving). Default 1024.
    """

    def __init__(
        self,
        use_pin_memory: bool = True,
        use_streams: bool = True,
        max_fwd_stash_size: int = 5,
        min_offload_size: int = 1024,
    ) -> None:
        self.use_pin_memory = use_pin_memory
        self.use_streams = use_streams
        self.max_fwd_stash_size = max_fwd_stash_size
        self.min_offload_size = min_offload_size
        self.num_offloaded = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.device | None, torch.Tensor]:
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.device.type == "cpu" or nbytes < self.min_offload_size or _is_parameter_like(tensor):
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


class NoOpManager(torch.autograd.graph.saved_tensors_hooks):
    """Saves tensors for backward as they are, overriding an enclosing :class:`OffloadActivations` (only the
    innermost saved-tensors hooks apply). Use it around a region that should not be offloaded, such as the output
    projection whose result the loss needs right away."""

    def __init__(self) -> None:
        super().__init__(_identity, _identity)


def _identity(tensor: Any) -> Any:
    return tensor


def get_act_offloading_ctx_manager(
    model: nn.Module, enable_activation_offloading: bool
) -> OffloadActivations | contextlib.nullcontext:
    """The context to run the forward pass in: :class:`OffloadActivations` when enabled, else a no-op context.

    When enabled and ``model.output`` is a module, the output projection runs under :class:`NoOpManager` (hooks
    added to it): its activations are needed by the loss as soon as forward ends, so offloading them would only
    copy them out and straight back.

    Args:
        model (nn.Module): the model whose forward runs in the context.
        enable_activation_offloading (bool): whether to offload.

    Returns:
        OffloadActivations | contextlib.nullcontext: the context manager.
    """
    if not enable_activation_offloading:
        return contextlib.nullcontext()
    output = getattr(model, "output", None)
    output = getattr(output, "linear", output)  # a tied output projection wraps its linear
    if isinstance(output, nn.Module):
        keep_on_device = NoOpManager()
        output.register_forward_pre_hook(lambda *args: keep_on_device.__enter__())
        output.register_forward_hook(lambda *args: keep_on_device.__exit__(None, None, None), always_call=True)
    return OffloadActivations()


def set_activation_checkpointing(model: nn.Module, auto_wrap_policy: WrapPolicy, **kwargs: Any) -> None:
    """torchtune's name for :func:`apply_activation_checkpointing`.

    tune wraps each matching module's ``forward`` in place instead of inserting torch's ``CheckpointWrapper``
    modules, so parameter names and state-dict keys stay the same; torch's wrapper options therefore do not apply.

    Args:
        model (nn.Module): the model.
        auto_wrap_policy (set[type] | Callable): as for :func:`apply_activation_checkpointing`.
        **kwargs: torch's ``apply_activation_checkpointing`` options; none is supported.

    Raises:
        ValueError: if options are passed, or the policy matches no submodule.
    """
    if kwargs:
        raise ValueError(
            f"set_activation_checkpointing does not take torch's checkpoint-wrapper options ({sorted(kwargs)}): tune "
            "checkpoints non-reentrantly by wrapping forward in place. Remove them."
        )
    apply_activation_checkpointing(model, auto_wrap_policy)


def apply_selective_activation_checkpointing(model: nn.Module, ac_mode: str, ac_option: int | str | None) -> None:
    """Checkpoints all, or every ``ac_option``-th, of the transformer layers in ``model.layers``.

    Args:
        model (nn.Module): a decoder with a ``layers`` ModuleList.
        ac_mode (str): ``"full"`` (every layer), ``"selective"`` (every ``ac_option``-th layer, counting from 1:
            ``2`` checkpoints the 2nd, 4th, ... layer; ``0`` or ``1`` every layer) or ``"none"``.
        ac_option (int | str | None): the layer interval for ``"selective"``; ignored otherwise.

    Raises:
        ValueError: for another ``ac_mode``, a ``"selective"`` interval that is not a non-negative integer (op-level
            selective checkpointing, ``"op"``, is not offered), or a model without ``layers``.
    """
    if ac_mode == "none":
        return
    if ac_mode not in ("full", "selective"):
        raise ValueError(f"ac_mode must be 'none', 'full' or 'selective'; received {ac_mode!r}.")
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"apply_selective_activation_checkpointing needs model.layers; {type(model).__name__} has none."
        )
    every = 1
    if ac_mode == "selective":
        if not str(ac_option).isdigit():
            raise ValueError(
                f"ac_mode='selective' needs ac_option, a non-negative layer interval (2: every second layer); "
                f"received {ac_option!r}."
            )
        every = max(int(ac_option), 1)
    chosen = {id(layer) for index, layer in enumerate(layers) if (index + 1) % every == 0}
    apply_activation_checkpointing(model, lambda module: id(module) in chosen)
