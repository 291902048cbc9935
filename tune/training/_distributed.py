"""FSDP2 helpers for the distributed recipes: process group, sharding, loading and gathering state dicts, and
stopping every rank together when a write on one of them fails.

The model is written for one device; these functions shard it from outside with
``torch.distributed.fsdp.fully_shard`` (one FSDP unit per transformer layer, plus the root), load a full
checkpoint straight into the shards, and gather full weights back for saving.
"""

import atexit
import contextlib
import gc
import os
import pickle
import random
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from tune.modules.peft import (
    DoRALinear,
    LoRALinear,
    LoRASwiGLUExperts,
    check_nf4_shardable,
    dequantize,
    is_adapter_key,
    is_nf4_tensor,
    to_nf4,
)
from tune.training._expert_parallel import EDP, expert_parallel_modules
from tune.utils import TuneError, get_logger, get_rank

log = get_logger(name=__name__)

ShardCondition = Callable[[str, nn.Module], bool]


class LoadResult(NamedTuple):
    """What :func:`load_from_full_model_state_dict` did not load, with ``load_state_dict``'s field names."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def is_distributed() -> bool:
    """Whether this process was launched for a distributed run (by torchrun or ``tune run --nproc_per_node``).

    True when ``torch.distributed`` is available and the environment holds what its ``env://`` initialisation
    reads: ``MASTER_ADDR``, ``MASTER_PORT`` and ``RANK`` (as torchtune's ``is_distributed``). Whether a process
    group is initialised yet is another question: ``torch.distributed.is_initialized()``.

    Returns:
        bool: whether the torchrun environment is set.
    """
    launched = all(os.environ.get(name, "") for name in ("MASTER_ADDR", "MASTER_PORT")) and "RANK" in os.environ
    return launched and int(os.environ["RANK"]) >= 0 and dist.is_available()


def _has_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _resolve_backend(backend: str | None) -> str:
    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if "nccl" in backend and not torch.cuda.is_available():
        raise ValueError(
            f"backend={backend!r} needs CUDA, which this machine does not have. Use backend='gloo' for CPU "
            "training, or leave the backend unset to pick gloo on CPU and nccl on GPU."
        )
    return backend


def init_distributed(backend: str | None = None, timeout_seconds: float | None = None, **kwargs: Any) -> bool:
    """Initialises the default process group from torchrun's environment (``tune run --nproc_per_node N``).

    Outside torchrun (no ``RANK``/``WORLD_SIZE`` in the environment) it starts a one-process group on a free
    local port, so a distributed recipe also runs as a plain single process. Under NCCL each process is bound to
    the GPU ``LOCAL_RANK``. A group this call initialised is destroyed when the process exits, if the recipe has
    not done so (it stopped with an error during setup, say).

    Args:
        backend (str | None): ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``...; ``None`` picks nccl when CUDA
            is available, else gloo.
        timeout_seconds (float | None): collective timeout; ``None`` keeps PyTorch's default.
        **kwargs: passed to ``torch.distributed.init_process_group`` (torchtune's form, e.g. ``timeout=``).

    Returns:
        bool: True if this call initialised the group, False if one was already initialised.

    Raises:
        ValueError: if NCCL is requested on a machine without CUDA.
    """
    backend = _resolve_backend(backend)
    if _has_process_group():
        return False
    kwargs = {**kwargs, "backend": backend}
    if timeout_seconds is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_seconds)
    if "nccl" in backend:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(**kwargs)  # torchrun set MASTER_ADDR/PORT: the env:// rendezvous
    else:
        log.info("No torchrun environment found: starting a one-process group (world size 1).")
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, **kwargs)
    atexit.unregister(_destroy_at_exit)  # once, however many groups a process initialises in turn
    atexit.register(_destroy_at_exit)
    return True


def _destroy_at_exit() -> None:
    # A gloo group destroyed while the interpreter shuts down may abort the process ("terminate called without an
    # active exception", SIGABRT) instead of letting it exit with its own status: this happens when a recipe stops
    # with an error before its cleanup. Destroy the group now, and collect the recipe's objects that keep the
    # subgroups of its device mesh (a DeviceMesh holds its ProcessGroups after destroy_process_group).
    if _has_process_group():
        dist.destroy_process_group()
    gc.collect()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over all ranks, as a new tensor; the tensor itself when not distributed.

    A collective: every rank must call it at the same point. Under NCCL the tensor must be on the GPU.

    Args:
        tensor (torch.Tensor): e.g. this rank's loss-token count.

    Returns:
        torch.Tensor: the sum over ranks.
    """
    if not _has_process_group() or dist.get_world_size() == 1:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``tensor`` over all ranks, as a new tensor; the tensor itself when not distributed
    (a minimum is the negated maximum of the negated values).

    A collective: every rank must call it at the same point. Under NCCL the tensor must be on the GPU.

    Args:
        tensor (torch.Tensor): e.g. this rank's largest reward.

    Returns:
        torch.Tensor: the maximum over ranks.
    """
    if not _has_process_group() or dist.get_world_size() == 1:
        return tensor
    result = tensor.clone()
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return result


def sync_seed(seed: int | None) -> int | None:
    """The seed every rank must use: ``seed`` itself, or, for ``None``, one drawn on rank 0 and broadcast.

    Ranks must agree on the seed: it orders the data sampler's shards (different seeds would give ranks
    overlapping samples) and initialises LoRA adapters, which must start equal on every rank. A collective
    when ``seed`` is None and a process group with several ranks is initialised.

    Args:
        seed (int | None): the configured seed.

    Returns:
        int | None: the seed to pass to :func:`tune.training.set_seed` (``None`` only without a process group,
        where ``set_seed`` draws one itself).
    """
    if seed is not None or not _has_process_group() or dist.get_world_size() == 1:
        return seed
    drawn = [random.SystemRandom().randint(0, 2**32 - 1) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(drawn, src=0)
    return drawn[0]


@contextlib.contextmanager
def errors_on_all_ranks() -> Iterator[None]:
    """Raises an error of the block on every rank, so that all ranks stop together at the end of the block.

    For the writes that rank 0 alone makes in a distributed recipe (the metric log, the gathered model, the run's
    config): without it, a write that fails on rank 0 (a full disk, reported as one
    :class:`~tune.utils.TuneError` line) stops rank 0 only, and the other ranks learn of it in their next
    collective, as a lost connection with a traceback. Every rank enters the block; rank 0 writes (a metric logger
    is a no-op on the other ranks; a save sits under ``if rank == 0``)::

        with training.errors_on_all_ranks():
            metric_logger.log_dict(metrics, step=step)

    On leaving the block the ranks share their outcome in one small collective (``all_gather_object``), which
    also makes it a barrier: use it at logging and saving steps, never per micro-batch. A rank whose block raised
    raises its own exception; when only other ranks raised, a rank raises the error of the lowest of them: a
    ``TuneError`` as the same class with the same message, another exception (a bug, whose traceback that rank
    prints) as a ``TuneError`` naming the rank and the exception. The recipe entry point prints a ``TuneError``
    on rank 0 only, so the user reads one line. Without a process group, or with one rank, the block runs as it
    is, with no collective.

    Raises:
        TuneError: the error a rank's block raised (its own class, e.g. ``MetricLoggerError``), on every rank.
    """
    if not _has_process_group() or dist.get_world_size() == 1:
        yield
        return
    failure = None
    try:
        yield
    except Exception as error:  # not KeyboardInterrupt: an interrupt reaches every rank by itself
        failure = error
    outcomes: list[TuneError | str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, None if failure is None else _shareable(failure))
    if failure is not None:
        raise failure
    for rank, outcome in enumerate(outcomes):
        if isinstance(outcome, TuneError):
            raise outcome
        if outcome is not None:
            raise TuneError(f"Rank {rank} stopped with {outcome} (its traceback is in its output); every rank stops.")


def _shareable(error: Exception) -> TuneError | str:
    # what the other ranks raise: a TuneError that survives pickling unchanged (class, attributes, message), else a
    # plain TuneError with its message (a subclass whose __init__ takes other arguments); for another exception, its
    # class name and message
    if not isinstance(error, TuneError):
        return f"{type(error).__name__}: {error}"
    try:
        copy = pickle.loads(pickle.dumps(error))
    except Exception:
        copy = None
    if type(copy) is type(error) and str(copy) == str(error):
        return error
    return TuneError(str(error))


def init_adapters(model: nn.Module, device: torch.device | str) -> int:
    """Creates and initialises the LoRA/DoRA adapters of a model built on the meta device, leaving the base
    weights on meta for :func:`load_from_full_model_state_dict`.

    Adapters are not in the base checkpoint, so each rank initialises them itself before :func:`shard_model`:
    with the same seed on every rank (:func:`sync_seed`, then ``set_seed``) and the same module order, every
    rank draws the same values and FSDP keeps each rank's shard of one consistent tensor. ``lora_a`` gets
    Kaiming-uniform and ``lora_b`` zeros (``initialize_parameters``); a DoRA ``magnitude`` is allocated but
    depends on the base weight, so call ``initialize_dora_magnitude()`` once the weights are loaded.

    Args:
        model (nn.Module): the model on the meta device.
        device (torch.device | str): where the adapters are created (the device that shards live on).

    Returns:
        int: the number of adapter layers initialised.
    """
    count = 0
    for module in model.modules():
        if not isinstance(module, (LoRALinear, DoRALinear, LoRASwiGLUExperts)):
            continue
        # "lora_a.weight", "lora_b.weight" (and "magnitude"); the experts' "gate_proj_lora_a", ...
        for name in module.adapter_params():
            owner_name, _, param_name = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            param = getattr(owner, param_name)
            if param.is_meta:
                fresh = torch.empty_like(param, device=device)
                setattr(owner, param_name, nn.Parameter(fresh, requires_grad=param.requires_grad))
        module.initialize_parameters()
        count += 1
    return count


def _is_layer(name: str, module: nn.Module) -> bool:
    # default rule: every element of a ModuleList called `layers` (a decoder's transformer layers)
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit()


def _as_condition(rule: ShardCondition | type) -> ShardCondition:
    if isinstance(rule, type):
        return lambda name, module: isinstance(module, rule)
    if callable(rule):
        return rule
    raise TypeError(f"A shard condition must be an nn.Module class or a callable(name, module); received {rule!r}.")


def shard_model(
    model: nn.Module,
    shard_conditions: Iterable[ShardCondition | type] | None = None,
    *,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    dp_mesh: Any = None,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = torch.float32,
    expert_mesh: Any = None,
) -> nn.Module:
    """Shards ``model`` in place with FSDP2: one ``fully_shard`` unit per matching submodule, then the root.

    Stacked experts (``[num_experts, out, in]``) are sharded along dim 0 like any parameter: each rank holds
    ``ceil(num_experts / ranks)`` experts (fewer, or none, on the last ranks when the number of ranks does not
    divide it: FSDP pads the last shards) and every forward pass gathers all of them. With expert parallelism
    (:func:`~tune.training.apply_expert_parallel` first, and its mesh as ``expert_mesh``) each expert module is
    instead its own unit over ``expert_mesh["edp"]``: the ranks that hold the same experts shard them, and their
    gradients are summed over those ranks and divided by the number of data-parallel ranks, as every other
    gradient is (each expert already received the gradients of every rank of its group through the all-to-all).

    Args:
        model (nn.Module): the model, on the meta device or materialised.
        shard_conditions (Iterable[Callable | type] | None): which submodules become their own FSDP unit: module
            classes (``TransformerSelfAttentionLayer``) or callables ``(fully_qualified_name, module) -> bool``
            (a family's shard rule from the registry); a module matching any one is sharded. ``None`` shards
            each element of every ``layers`` ModuleList.
        cpu_offload (bool): keep sharded parameters, gradients and optimizer states on CPU.
        reshard_after_forward (bool): free each layer's gathered parameters after its forward (less memory,
            one more all-gather in backward). The root unit (embeddings, final norm, output) always stays
            gathered until backward, because the chunked loss uses ``model.output`` after forward.
        dp_mesh (DeviceMesh | None): data-parallel mesh; default: all ranks of the default group.
        param_dtype (torch.dtype | None): dtype of the gathered parameters for compute (mixed precision);
            ``None`` computes in the parameters' own dtype.
        reduce_dtype (torch.dtype | None): dtype of the gradient reduce-scatter.
        expert_mesh (DeviceMesh | None): the ``(edp, ep)`` mesh given to
            :func:`~tune.training.apply_expert_parallel`; None without expert parallelism.

    Returns:
        nn.Module: the same model, now sharded.

    Raises:
        ValueError: if no process group is initialised.
        TypeError: for a shard condition that is neither a class nor a callable.
        NF4ShardingError: for an NF4 (QLoRA) base weight that cannot be split evenly over the ranks.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not _has_process_group():
        raise ValueError("shard_model needs a process group: call tune.training.init_distributed() first.")
    # FSDP splits parameters over the mesh's last dimension (the only one for FSDP, the shard one for HSDP)
    num_shards = dist.get_world_size() if dp_mesh is None else dp_mesh.size(dp_mesh.ndim - 1)
    for name, param in model.named_parameters():
        if is_nf4_tensor(param):  # before fully_shard, where torchao would fail with a bare AssertionError
            check_nf4_shardable(name, param, num_shards)
    conditions = [_as_condition(rule) for rule in shard_conditions] if shard_conditions is not None else [_is_layer]
    fsdp_kwargs: dict[str, Any] = {"reshard_after_forward": reshard_after_forward, "mesh": dp_mesh}
    fsdp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if cpu_offload:
        # pinned host memory needs CUDA; on a CPU-only run offloading moves nothing anyway
        fsdp_kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    # children before parents, so each unit owns exactly the parameters no inner unit took
    if expert_mesh is not None:
        for module in expert_parallel_modules(model):
            fully_shard(module, **{**fsdp_kwargs, "mesh": expert_mesh[EDP]})
            # FSDP would divide by the edp size; the loss scaling expects the mean over all data-parallel ranks
            module.set_gradient_divide_factor(float(num_shards))
    num_units = 0
    for name, module in reversed(list(model.named_modules())):
        if name and any(condition(name, module) for condition in conditions):
            fully_shard(module, **fsdp_kwargs)
            num_units += 1
    if num_units == 0:
        log.warning("shard_model: no submodule matched the shard conditions; only the root is sharded.")
    # The root keeps its parameters gathered from forward until backward is done: the chunked loss applies
    # `model.output` after forward returns (and again in backward to recompute chunks), and backward would
    # gather them right away anyway.
    fully_shard(model, **{**fsdp_kwargs, "reshard_after_forward": False})
    return model


def load_from_full_model_state_dict(
    model: nn.Module,
    full_sd: Mapping[str, torch.Tensor],
    device: torch.device | str | None = None,
    strict: bool = False,
    cpu_offload: bool = False,
) -> LoadResult:
    """Loads a full (unsharded) state dict into a sharded model; each rank keeps only its own shards.

    Every rank passes the same full state dict (typically memory-mapped safetensors, so nothing is duplicated
    in RAM); each parameter is cut into this rank's shard on ``device`` with ``distribute_tensor``, without
    communication. NF4 base weights of QLoRA layers are quantised from the full weight, then split. Works for a
    model built on the meta device and sharded with :func:`shard_model`:
    non-persistent buffers left on meta (RoPE tables) are materialised and recomputed with the module's
    ``rope_init``/``reset_parameters``.

    Parameters the checkpoint does not hold (LoRA adapters at the start of training) are left as they are, with
    ``strict=False``: initialise them before :func:`shard_model`, on every rank with the same seed
    (``module.to_empty(device="cpu")`` then ``module.reset_parameters()`` on the adapter submodules of the meta
    model), so every rank holds the same full values and FSDP keeps each rank's shard. A model may be loaded in
    parts, as torchtune's recipes do when resuming (the adapter, then the base weights): what the first call does
    not hold stays on the meta device until a later one. Check the finished model with
    :func:`validate_no_params_on_meta_device`.

    Args:
        model (nn.Module): the sharded model (its parameters are DTensors).
        full_sd (Mapping[str, torch.Tensor]): full tensors keyed like ``model.state_dict()``.
        device (torch.device | str | None): the compute device, where shards and buffers live; default: the device
            of the current process (``cuda:LOCAL_RANK`` under NCCL, else CPU).
        strict (bool): require the keys to match exactly. Default False, as in torchtune (tune's recipes pass
            True when they load a whole model).
        cpu_offload (bool): the model was sharded with ``cpu_offload=True``: shards stay in CPU memory (buffers,
            which FSDP does not move, still go to ``device``).

    Returns:
        LoadResult: the model keys the checkpoint lacks (``missing_keys``) and the checkpoint keys the model lacks
        (``unexpected_keys``), like ``nn.Module.load_state_dict``.

    Raises:
        ValueError: for missing or unexpected keys (when ``strict``), or a shape mismatch.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    compute_device = torch.device(device) if device is not None else _default_device()
    shard_device = torch.device("cpu") if cpu_offload else compute_device
    full_state_dict = full_sd
    current = model.state_dict()
    _check_keys(current.keys(), full_state_dict.keys(), strict)
    sharded: dict[str, torch.Tensor] = {}
    quantized: dict[str, torch.Tensor] = {}
    for key, target in current.items():
        if key not in full_state_dict:
            continue
        full = full_state_dict[key]
        if tuple(full.shape) != tuple(target.shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(full.shape)} but model expects {tuple(target.shape)}.")
        # FSDP moves offloaded shards to the GPU for compute itself; anything it does not manage (buffers) must be
        # on the compute device already
        full = full.to(device=shard_device if isinstance(target, DTensor) else compute_device, dtype=target.dtype)
        if isinstance(target, DTensor) and is_nf4_tensor(target.to_local()):
            quantized[key] = _shard_nf4(key, full, target)
        elif isinstance(target, DTensor):
            sharded[key] = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        else:
            sharded[key] = full
        if cpu_offload and isinstance(target, DTensor):
            # a DTensor's shard lands on its mesh's device (the GPU); offloaded FSDP expects it in CPU memory
            done = quantized if key in quantized else sharded
            done[key] = done[key].cpu()
    # assign=True swaps in the new tensors, which is how meta parameters become real ones (keys checked above)
    model.load_state_dict(sharded, strict=False, assign=True)
    for key, value in quantized.items():
        # set directly: a QLoRA layer's load hook would quantise the (already quantised) shard again
        module_name, _, param_name = key.rpartition(".")
        setattr(model.get_submodule(module_name), param_name, nn.Parameter(value, requires_grad=False))
    _materialise_meta_buffers(model, compute_device)
    return LoadResult(
        missing_keys=sorted(set(current) - set(full_state_dict)),
        unexpected_keys=sorted(set(full_state_dict) - set(current)),
    )


def _shard_nf4(key: str, full: torch.Tensor, target: Any) -> torch.Tensor:
    """This rank's dim-0 shard of the NF4 quantisation of ``full``, as a DTensor shaped like ``target``.

    Quantising the full weight once and then splitting keeps every shard's blocks and scales identical to a
    single-device QLoRA model. torchao's NF4 split needs whole rows and groups of block scales per rank.
    """
    from torch.distributed.tensor import DTensor

    mesh = target.device_mesh
    if mesh.ndim != 1:
        raise ValueError(f"{key}: NF4 (QLoRA) weights can only be sharded on a 1-D mesh; got {mesh.ndim}-D.")
    world_size, rank = mesh.size(0), mesh.get_local_rank(0)
    quantized = to_nf4(full)
    check_nf4_shardable(key, quantized, world_size)
    local = quantized.chunk(world_size, dim=0)[rank]
    return DTensor.from_local(
        local, mesh, target.placements, run_check=False, shape=target.shape, stride=target.stride()
    )


def _default_device() -> torch.device:
    if _has_process_group() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_keys(model_keys: Iterable[str], checkpoint_keys: Iterable[str], strict: bool) -> None:
    model_keys, checkpoint_keys = set(model_keys), set(checkpoint_keys)
    missing, unexpected = sorted(model_keys - checkpoint_keys), sorted(checkpoint_keys - model_keys)
    if strict and (missing or unexpected):
        raise ValueError(
            f"State dict does not match the model: missing {missing[:10]}{'...' if len(missing) > 10 else ''}, "
            f"unexpected {unexpected[:10]}{'...' if len(unexpected) > 10 else ''}. Check that the checkpoint "
            "belongs to this model (and its converter), or pass strict=False to load a subset (e.g. adapters)."
        )


def _materialise_meta_buffers(model: nn.Module, device: torch.device) -> None:
    for name, module in model.named_modules():
        meta = [b for b, buf in module.named_buffers(recurse=False) if buf is not None and buf.is_meta]
        if not meta:
            continue
        init = getattr(module, "rope_init", None) or getattr(module, "reset_parameters", None)
        if init is None or any(True for _ in module.parameters(recurse=False)):
            raise ValueError(
                f"Buffers {meta} of {name or 'the model'} ({type(module).__name__}) are still on the meta device "
                "and the module has no parameter-free `rope_init`/`reset_parameters` to recompute them. Make "
                "them persistent (so the checkpoint carries them) or give the module such a method."
            )
        for buffer_name in meta:
            old = module._buffers[buffer_name]
            module._buffers[buffer_name] = torch.empty_like(old, device=device)
        init()


def gather_cpu_state_dict(
    model: nn.Module,
    is_rank_zero: bool | None = None,
    device: torch.device | str | None = None,
    adapter_weights_only: bool = False,
    key_filter: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """Full, unsharded copy of the model's state dict on CPU, for saving.

    A collective: every rank must call it. Parameters are gathered one at a time, so peak memory holds one full
    tensor beyond the shards.

    NF4 (QLoRA) base weights come back dequantised, in the dtype the layer computes in.

    Args:
        model (nn.Module): a model sharded with :func:`shard_model` (unsharded tensors are copied as they are).
        is_rank_zero (bool | None): whether this process keeps the result; a process passing False gets ``{}``
            (torchtune's recipes pass ``rank == 0``; pass True on every rank to keep it everywhere). Default None:
            only rank 0 keeps it.
        device (torch.device | str | None): where a shard is moved before gathering, for CPU-offloaded models
            whose collectives run on the GPU (``cuda`` under NCCL). Default None: gather where the shard is.
        adapter_weights_only (bool): gather only LoRA/DoRA adapter entries (``tune.modules.peft.is_adapter_key``),
            to save an adapter without gathering the base model. Default False.
        key_filter (Callable[[str], bool] | None): gather only the entries whose key it accepts; ``None`` gathers
            everything (within ``adapter_weights_only``). Every rank must pass the same filter.

    Returns:
        dict[str, torch.Tensor]: full CPU tensors keyed like ``model.state_dict()``.
    """
    from torch.distributed.tensor import DTensor

    keep = get_rank() == 0 if is_rank_zero is None else is_rank_zero
    gathered: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if (key_filter is not None and not key_filter(key)) or (adapter_weights_only and not is_adapter_key(key)):
            continue
        if isinstance(value, DTensor):
            if device is not None:
                value = value.to(device)
            local = value.to_local()
            if is_nf4_tensor(local):  # QLoRA base weight: gather its dequantised shards
                value = DTensor.from_local(
                    dequantize(local), value.device_mesh, value.placements, shape=value.shape, stride=value.stride()
                )
            value = value.full_tensor()
        elif is_nf4_tensor(value):
            value = dequantize(value)
        if keep:
            gathered[key] = value.detach().to("cpu", copy=True)
    return gathered


def get_distributed_backend(device_type: str, offload_ops_to_cpu: bool = False) -> str:
    """The ``torch.distributed`` backend for ``device_type`` (``"gloo"`` for cpu, ``"nccl"`` for cuda, ...).

    Args:
        device_type (str): ``"cpu"``, ``"cuda"``, ``"xpu"``, ...; a type torch does not map gets ``"nccl"``.
        offload_ops_to_cpu (bool): also give CPU tensors a backend (``"cuda:nccl,cpu:gloo"``), for FSDP CPU
            offload or asynchronous DCP saves; on CPU, whose backend already is gloo, it changes nothing.
            Default False.

    Returns:
        str: a backend string for :func:`init_distributed` or ``init_process_group``.
    """
    backend = dist.Backend.default_device_backend_map.get(device_type, "nccl")
    if offload_ops_to_cpu and device_type != "cpu":  # "cpu:gloo,cpu:gloo" is rejected by init_process_group
        return f"{device_type}:{backend},cpu:gloo"
    return backend


def get_shard_conditions(
    name: str, module: nn.Module, names_to_match: list[str] | None = None, *args: Any, **kwargs: Any
) -> bool:
    """torchtune's default FSDP rule: a module named ``...layers.<i>``, or one whose name is in ``names_to_match``.

    Pass it, or ``functools.partial(get_shard_conditions, names_to_match=[...])``, in ``shard_conditions`` of
    :func:`shard_model`.

    Args:
        name (str): the module's fully qualified name.
        module (nn.Module): the module (unused: the rule looks at names).
        names_to_match (list[str] | None): further names that become their own FSDP unit (e.g. ``["tok_embeddings"]``).
        *args: ignored.
        **kwargs: ignored.

    Returns:
        bool: whether the module gets its own FSDP unit.
    """
    return bool(names_to_match and name in names_to_match) or _is_layer(name, module)


def validate_no_params_on_meta_device(model: nn.Module) -> None:
    """Checks that no parameter or buffer of ``model`` is still on the meta device.

    Raises:
        RuntimeError: naming the first parameter or buffer left on meta.
    """
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise RuntimeError(
                f"{name} is still on the meta device: load a checkpoint that has it or initialise it "
                "(`module.to_empty(device=...)` then `reset_parameters()`) before training."
            )


def set_torch_num_threads() -> None:
    """Sets torch's intra-op threads to the CPU count divided by the number of local GPUs (one process per GPU),
    so the processes of a node do not oversubscribe its cores."""
    num_threads = max(1, (os.cpu_count() or 1) // max(1, torch.cuda.device_count()))
    torch.set_num_threads(num_threads)
    log.info(f"torch intra-op threads: {num_threads}")


def get_full_optimizer_state_dict(
    model: nn.Module, opt: torch.optim.Optimizer, is_rank_zero: bool, device: torch.device | None = None
) -> dict[str, Any]:
    """The optimizer state of a sharded model, gathered into full CPU tensors keyed by parameter name.

    A collective: every rank must call it.

    Args:
        model (nn.Module): the model sharded with :func:`shard_model`.
        opt (torch.optim.Optimizer): its optimizer.
        is_rank_zero (bool): whether this process keeps the result; the others get ``{}``.
        device (torch.device | None): unused; the result is on CPU. Default None.

    Returns:
        dict[str, Any]: ``{"state": ..., "param_groups": ...}`` in ``torch.distributed.checkpoint``'s
        full-state-dict form, or ``{}``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_optimizer_state_dict(model, opt, options=options)
    return full if is_rank_zero else {}


def load_from_full_optimizer_state_dict(
    model: nn.Module, opt: torch.optim.Optimizer, full_sd: dict[str, Any], device: torch.device
) -> None:
    """Loads a full optimizer state (from :func:`get_full_optimizer_state_dict`) into a sharded model's optimizer.

    A collective: every rank must call it; rank 0's ``full_sd`` is broadcast, so the other ranks may pass ``{}``.

    Args:
        model (nn.Module): the model sharded with :func:`shard_model`.
        opt (torch.optim.Optimizer): its optimizer.
        full_sd (dict[str, Any]): the full optimizer state.
        device (torch.device): the training device (a CPU device keeps the loaded state on CPU).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, cpu_offload=torch.device(device).type == "cpu"
    )
    set_optimizer_state_dict(model, opt, optim_state_dict=full_sd, options=options)
