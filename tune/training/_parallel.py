"""Device meshes and tensor parallelism for the distributed recipes.

The ranks form a 3-D mesh ``(dp_shard, cp, tp)``: ranks in one ``cp`` group share each batch, a slice of every
sequence each (``tune.training.ContextParallel``); ranks in one ``tp`` group (neighbours, so on one node) split
each layer's matrices with tensor parallelism, and FSDP2 shards what each tp group holds across the
``dp_shard`` (x ``cp``) ranks. A rank's data is that of its ``dp_shard`` index: the ranks of a tp group see the same
batch. Model code stays single-device: the family's plan (``tune.registry``) names the styles, and
:func:`apply_tensor_parallel` applies it from outside.
"""

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from tune.modules import MultiHeadAttention
from tune.modules.peft import DoRALinear, LoRALinear
from tune.utils import get_logger

log = get_logger(name=__name__)

DP_SHARD, CP, TP = "dp_shard", "cp", "tp"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _common_divisors(a: int, b: int) -> list[int]:
    return [d for d in _divisors(a) if b % d == 0]


def init_device_mesh(
    world_size: int, tensor_parallel_dim: int = 1, device_type: str = "cpu", context_parallel_dim: int = 1
) -> Any:
    """The ``(dp_shard, cp, tp)`` device mesh of a run: ``world_size // (context_parallel_dim x tensor_parallel_dim)``
    data-parallel shards, each of ``context_parallel_dim`` groups of ``tensor_parallel_dim`` ranks.

    A collective: every rank calls it with the same arguments, after :func:`tune.training.init_distributed`.

    Args:
        world_size (int): the number of processes (``torch.distributed.get_world_size()``).
        tensor_parallel_dim (int): ranks per tensor-parallel group; 1 for FSDP only.
        device_type (str): ``"cuda"`` or ``"cpu"``.
        context_parallel_dim (int): ranks that share each sequence (``tune.training.ContextParallel``); 1 for none.

    Returns:
        DeviceMesh: 3-D, with dimensions named ``"dp_shard"``, ``"cp"`` and ``"tp"``.

    Raises:
        ValueError: if ``tensor_parallel_dim x context_parallel_dim`` is not a positive divisor of ``world_size``.
    """
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    for key, value in (("tensor_parallel_dim", tensor_parallel_dim), ("context_parallel_dim", context_parallel_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}.")
    if world_size % tensor_parallel_dim:
        raise ValueError(
            f"tensor_parallel_dim={tensor_parallel_dim} does not divide the world size {world_size}: every "
            f"tensor-parallel group needs exactly {tensor_parallel_dim} processes. Use a tensor_parallel_dim in "
            f"{_divisors(world_size)}, or launch a multiple of {tensor_parallel_dim} processes "
            "(--nproc_per_node x --nnodes)."
        )
    if (world_size // tensor_parallel_dim) % context_parallel_dim:
        raise ValueError(
            f"context_parallel_dim={context_parallel_dim} does not divide the {world_size // tensor_parallel_dim} "
            f"groups of tensor_parallel_dim={tensor_parallel_dim} rank(s) of the world size {world_size}. Use a "
            f"context_parallel_dim in {_divisors(world_size // tensor_parallel_dim)}, or launch a multiple of "
            f"{context_parallel_dim * tensor_parallel_dim} processes (--nproc_per_node x --nnodes)."
        )
    shape = (world_size // (context_parallel_dim * tensor_parallel_dim), context_parallel_dim, tensor_parallel_dim)
    return torch_init_device_mesh(device_type, shape, mesh_dim_names=(DP_SHARD, CP, TP))


def _matches(pattern: str, name: str) -> bool:
    # one `*` stands for one name component, as in parallelize_module's plans
    parts, pattern_parts = name.split("."), pattern.split(".")
    return len(parts) == len(pattern_parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern_parts))


def _planned_modules(model: nn.Module, plan: Mapping[str, Any]) -> dict[str, nn.Module]:
    names = {}
    for pattern in plan:
        found = {name: module for name, module in model.named_modules() if name and _matches(pattern, name)}
        if not found:
            raise ValueError(
                f"The tensor-parallel plan names {pattern!r}, which matches no submodule of the model. Check that "
                "the plan belongs to this model family (tensor_parallel_plan, or the family's tp_plan)."
            )
        names.update(found)
    return names


def _check_supported(planned: Mapping[str, nn.Module]) -> None:
    adapters = [name for name, module in planned.items() if isinstance(module, (LoRALinear, DoRALinear))]
    if adapters:
        raise ValueError(
            f"Tensor parallelism splits nn.Linear/nn.Embedding layers; {adapters[0]!r} is a LoRA/DoRA layer "
            f"({len(adapters)} in the plan). Train LoRA with tensor_parallel_dim: 1 (FSDP alone shards it), or "
            "use full fine-tuning with tensor parallelism."
        )


def _check_heads(model: nn.Module, tp_size: int) -> list[tuple[str, MultiHeadAttention]]:
    attention = [(n, m) for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    for _, module in attention:
        if module.num_heads % tp_size or module.num_kv_heads % tp_size:
            raise ValueError(
                f"tensor_parallel_dim={tp_size} must divide the attention head counts (num_heads="
                f"{module.num_heads}, num_kv_heads={module.num_kv_heads}): each rank computes whole heads. Use a "
                f"tensor_parallel_dim in {_common_divisors(module.num_heads, module.num_kv_heads)}."
            )
    return attention


def _is_split_by_heads(module: MultiHeadAttention) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    weight = getattr(module.q_proj, "weight", None)
    return isinstance(weight, DTensor) and weight.placements[-1] == Shard(0)


def _check_head_norms(name: str, module: MultiHeadAttention) -> None:
    from torch.distributed.tensor import DTensor

    for norm_name in ("q_norm", "k_norm"):
        norm = getattr(module, norm_name)
        if norm is not None and any(not isinstance(p, DTensor) for p in norm.parameters()):
            # each rank would see only its heads' share of the shared weight's gradient, and drift apart
            raise ValueError(
                f"{name}.{norm_name} normalises each head with one weight shared by all heads, but the plan splits "
                f"the heads without splitting it: its gradient would be summed over this rank's heads only. Add "
                f"'{name}.{norm_name}': SequenceParallel(sequence_dim=2, use_local_output=True) to the plan "
                "(as tune.models.qwen3's plan does)."
            )


def apply_tensor_parallel(model: nn.Module, plan: Mapping[str, Any], tp_mesh: Any) -> nn.Module:
    """Splits ``model``'s layers across the ranks of ``tp_mesh`` as ``plan`` says, in place.

    Applies ``plan`` with ``torch.distributed.tensor.parallel.parallelize_module``, then gives every attention
    module whose query projection was split by output features its per-rank head counts
    (``num_heads / tp``, ``num_kv_heads / tp``), since attention reshapes its projections by head count. Call it
    on the model built on the meta device (or materialised), before :func:`tune.training.shard_model`.

    Args:
        model (nn.Module): the decoder.
        plan (Mapping[str, ParallelStyle]): module name patterns to styles, e.g. a family's ``tp_plan(model)``
            (``tune.models.llama3.base_llama_tp_plan``).
        tp_mesh (DeviceMesh): the 1-D tensor-parallel mesh (``mesh["tp"]`` of :func:`init_device_mesh`).

    Returns:
        nn.Module: the same model.

    Raises:
        ValueError: if the tp size does not divide the head counts, a plan entry matches no submodule, or it
            names a LoRA/DoRA layer.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    tp_size = tp_mesh.size()
    if tp_size == 1:
        return model
    attention = _check_heads(model, tp_size)
    _check_supported(_planned_modules(model, plan))
    parallelize_module(model, tp_mesh, dict(plan))
    for name, module in attention:
        if _is_split_by_heads(module):
            _check_head_norms(name, module)
            module.num_heads //= tp_size
            module.num_kv_heads //= tp_size
    log.info("Tensor parallelism over %d ranks: %d plan entries applied.", tp_size, len(plan))
    return model


def data_parallel_rank_and_size(mesh: Any) -> tuple[int, int]:
    """This rank's index among the data-parallel shards, and their number (for the data sampler).

    Args:
        mesh (DeviceMesh | None): the mesh of :func:`init_device_mesh`; ``None`` for a run without one.

    Returns:
        tuple[int, int]: ``(dp_rank, dp_size)``; ``(0, 1)`` without a mesh.
    """
    if mesh is None:
        return 0, 1
    return mesh.get_local_rank(DP_SHARD), mesh.size(mesh.mesh_dim_names.index(DP_SHARD))


def tensor_parallel_size(mesh: Any) -> int:
    """The number of ranks in a tensor-parallel group of ``mesh`` (1 without a mesh)."""
    return 1 if mesh is None else mesh.size(mesh.mesh_dim_names.index(TP))


def context_parallel_size(mesh: Any) -> int:
    """The number of ranks in a context-parallel group of ``mesh`` (1 without a mesh or a ``cp`` dimension)."""
    return 1 if mesh is None or CP not in mesh.mesh_dim_names else mesh.size(mesh.mesh_dim_names.index(CP))


def fsdp_mesh(mesh: Any) -> Any:
    """The mesh FSDP shards over: ``dp_shard``, or ``dp_shard x cp`` flattened under context parallelism (the ranks
    of a ``cp`` group hold the same weights, so they shard them too)."""
    if context_parallel_size(mesh) == 1:
        return mesh[DP_SHARD]
    return mesh[DP_SHARD, CP]._flatten(f"{DP_SHARD}_{CP}")


def family_tensor_parallel_plan(model: nn.Module, model_type: str | None) -> dict[str, Any]:
    """The tensor-parallel plan the model family of ``model_type`` registers, for ``model``.

    Args:
        model (nn.Module): the model to split.
        model_type (str | None): the family (``checkpointer.model_type`` of a config, e.g. ``LLAMA3``).

    Returns:
        dict[str, Any]: module-name pattern -> ``ParallelStyle``.

    Raises:
        ValueError: when there is no family of that name, or it registers no plan.
    """
    from tune import registry

    family = registry.get_model_family(model_type) if model_type is not None else None
    if family is None or family.tp_plan is None:
        raise ValueError(
            f"the model family {model_type!r} (checkpointer.model_type) registers no tensor-parallel plan. Set "
            "tensor_parallel_dim: 1, or name a plan under tensor_parallel_plan"
        )
    return family.tp_plan(model)


def family_shard_conditions(model: nn.Module, model_type: str | None) -> list[Any]:
    """Which submodules of ``model`` become FSDP units: the family's rule when it registers one (by
    ``model_type``), else every transformer layer. Pass the result to :func:`~tune.training.shard_model`."""
    from tune import registry
    from tune.modules import TransformerSelfAttentionLayer

    family = registry.get_model_family(model_type) if model_type is not None else None
    if family is not None and family.fsdp_shard_modules is not None:
        units = {id(module) for module in family.fsdp_shard_modules(model)}
        return [lambda name, module: id(module) in units]
    return [TransformerSelfAttentionLayer]


def prepare_mha_for_tp(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Gives every attention module its per-rank sizes for tensor parallelism (``num_heads``, ``num_kv_heads`` and
    ``embed_dim`` divided by the tp size), in place, as torchtune does before ``parallelize_module``.

    :func:`apply_tensor_parallel` does this itself; call this one only when applying a plan with
    ``parallelize_module`` directly, never both.

    Args:
        model (nn.Module): the decoder (or a model holding it as ``decoder``).
        tp_mesh (DeviceMesh): the tensor-parallel mesh.

    Returns:
        nn.Module: the same model.

    Raises:
        ValueError: if the tp size does not divide the head counts or the embedding dimension.
    """
    tp_size = tp_mesh.size()
    decoder = getattr(model, "decoder", model)
    for _, module in _check_heads(decoder, tp_size):
        if module.embed_dim % tp_size:
            raise ValueError(f"tensor parallel size {tp_size} must divide embed_dim={module.embed_dim}.")
        module.num_heads //= tp_size
        module.num_kv_heads //= tp_size
        module.embed_dim //= tp_size
    return model


@dataclass(frozen=True)
class ParallelDims:
    """How a distributed run is laid out over its processes.

    Args:
        world_size (int): the number of processes.
        rank (int): this process's global rank.
        mesh (Any): the ``(dp_shard, tp)`` device mesh (:func:`tune.training.init_device_mesh`).
        dp_rank (int): this rank's index among the data-parallel shards (for the data sampler).
        dp_size (int): the number of data-parallel shards.
        tp_size (int): ranks per tensor-parallel group (they share one batch).
        ep_mesh (Any): the ``(edp, ep)`` mesh of expert parallelism, or ``None`` without it.
        cp_size (int): ranks per context-parallel group (they share one batch, a slice of each sequence each).
    """

    world_size: int
    rank: int
    mesh: Any
    dp_rank: int
    dp_size: int
    tp_size: int = 1
    ep_mesh: Any = None
    cp_size: int = 1
