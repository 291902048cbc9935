"""Expert parallelism for mixture-of-experts models, applied from outside the model code.

Without it, FSDP2 shards the stacked expert weights (``[num_experts, out, in]``) along dim 0 like any other
parameter and gathers all of them for every forward pass. With ``expert_parallel_dim: P`` the ranks form groups
of ``P`` neighbours; in a group, rank ``g`` owns the whole experts ``[g * E/P, (g + 1) * E/P)`` and never gathers
the others. Each MoE layer then sends every token slot (token, chosen expert) to the rank owning its expert,
which computes it with the single-device code of :class:`~tune.modules.moe.SwiGLUExperts` on its ``E/P``
experts (the module's one hook: ``local_param``, its parameters' local part), and sends the results back, all
with ``torch.distributed.all_to_all_single`` (gloo implements it on CPU, uneven splits included, in PyTorch
2.13; NCCL on GPUs: one code path). The data exchanges are differentiable (backward sends gradients back):

1. slots sorted by expert (the module's own order) are cut into ``P`` blocks, one per owning rank;
2. the block sizes are exchanged (one small all-to-all, read on the host: the only host sync it adds), then
   the rows and their router weights;
3. the owner runs its experts on what it received, with local expert indices, the router weight applied as
   the module applies it (to the output, or to the input for Llama 4's ``weight_inputs``);
4. the results travel back and are summed per token.

The expert parameters become DTensors ``Shard(0)`` over the 1-D ``ep`` mesh, so ``model.state_dict()``, the full
state dict gathered for the Hugging Face checkpoint, and ``torch.distributed.checkpoint`` still see the whole
``[num_experts, ...]`` tensor: checkpoints are the same with and without expert parallelism.
:func:`~tune.training.shard_model` then makes each expert module its own FSDP unit over the ``edp`` mesh (the
ranks that hold the same experts, one per group), which shards them further and reduces their gradients: an
expert's gradient on its rank already sums its whole ``ep`` group's tokens (the backward all-to-all), FSDP sums it
over the ``edp`` ranks and divides by the number of data-parallel ranks, as for every other parameter.
"""

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tune.modules.moe import SwiGLUExperts, moe_layers
from tune.modules.peft import is_nf4_tensor
from tune.utils import get_logger

log = get_logger(name=__name__)

# the mesh of expert parallelism: (edp, ep). Ranks of one `ep` group hold different experts; the `edp` ranks with
# the same `ep` index hold the same experts (their data differ: gradients are reduced over them)
EDP, EP = "edp", "ep"

# the expert modules converted by apply_expert_parallel -> their token exchange (weak: a freed model frees them)
_EXCHANGES: "weakref.WeakKeyDictionary[nn.Module, _TokenExchange]" = weakref.WeakKeyDictionary()


def init_expert_parallel_mesh(world_size: int, expert_parallel_dim: int, device_type: str = "cpu") -> Any:
    """The ``(edp, ep)`` device mesh of expert parallelism: groups of ``expert_parallel_dim`` neighbouring ranks.

    A collective: every rank calls it with the same arguments, after :func:`tune.training.init_distributed`.

    Args:
        world_size (int): the number of processes.
        expert_parallel_dim (int): ranks per expert-parallel group (each holds ``num_experts / expert_parallel_dim``
            whole experts).
        device_type (str): ``"cuda"`` or ``"cpu"``.

    Returns:
        DeviceMesh: 2-D, shape ``(world_size // expert_parallel_dim, expert_parallel_dim)``, dimensions named
        ``"edp"`` and ``"ep"``.

    Raises:
        ValueError: if ``expert_parallel_dim`` is not a positive divisor of ``world_size``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    check_expert_parallel_dim(expert_parallel_dim)
    if world_size % expert_parallel_dim:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"expert_parallel_dim={expert_parallel_dim} does not divide the world size {world_size}: every "
            f"expert-parallel group needs exactly {expert_parallel_dim} processes. Use an expert_parallel_dim in "
            f"{divisors}, or launch a multiple of {expert_parallel_dim} processes."
        )
    shape = (world_size // expert_parallel_dim, expert_parallel_dim)
    return init_device_mesh(device_type, shape, mesh_dim_names=(EDP, EP))


def check_expert_parallel_dim(expert_parallel_dim: Any) -> None:
    """Raises ``ValueError`` unless ``expert_parallel_dim`` is a positive integer."""
    if isinstance(expert_parallel_dim, bool) or not isinstance(expert_parallel_dim, int) or expert_parallel_dim < 1:
        raise ValueError(f"expert_parallel_dim must be a positive integer, got {expert_parallel_dim!r}.")


def apply_expert_parallel(model: nn.Module, ep_mesh: Any) -> nn.Module:
    """Distributes the experts of every MoE layer of ``model`` over the ``ep`` ranks of ``ep_mesh``, in place.

    Each expert module (:class:`~tune.modules.moe.SwiGLUExperts`, LoRA experts included: their adapters are
    split with their experts) keeps ``num_experts / P`` whole experts on each rank of an ``ep`` group: its
    parameters become ``Shard(0)`` DTensors on ``ep_mesh["ep"]`` (each rank keeps its slice of the tensor it
    holds, without communication: call it on the model built on the meta device, after any adapters were
    initialised the same on every rank), its ``num_experts`` becomes the local count, and forward hooks exchange
    the token slots with all-to-all (see the module docstring). Call it before
    :func:`~tune.training.shard_model`, with the same ``ep_mesh`` (as ``expert_mesh``) there.

    Args:
        model (nn.Module): the model (its router and MoE block stay as they are).
        ep_mesh (DeviceMesh): the mesh of :func:`init_expert_parallel_mesh`.

    Returns:
        nn.Module: the same model.

    Raises:
        ValueError: if the number of experts is not divisible by the ``ep`` size, or the experts are NF4 (QLoRA).
    """
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = ep_mesh[EP]
    size = mesh.size()
    layers = moe_layers(model)
    if not layers:
        log.warning("expert_parallel_dim=%d has no effect: the model has no mixture-of-experts layer.", size)
        return model
    for layer in layers:
        experts = layer.experts
        if not isinstance(experts, SwiGLUExperts):
            raise ValueError(f"expert parallelism needs SwiGLUExperts; the model has {type(experts).__name__}.")
        if experts.num_experts % size:
            divisors = [d for d in range(1, experts.num_experts + 1) if experts.num_experts % d == 0]
            raise ValueError(
                f"expert_parallel_dim={size} must divide the number of experts ({experts.num_experts}): every rank "
                f"holds the same number of whole experts. Use an expert_parallel_dim in {divisors}."
            )
        if any(is_nf4_tensor(p) for p in experts.parameters(recurse=False)):
            raise ValueError(
                "expert parallelism does not split NF4 (QLoRA) experts; use LoRA (quantize_base: False) or set "
                "expert_parallel_dim: 1 (FSDP alone shards them)."
            )
        for name, param in list(experts.named_parameters(recurse=False)):
            local = distribute_tensor(param.detach(), mesh, [Shard(0)], src_data_rank=None)
            setattr(experts, name, nn.Parameter(local, requires_grad=param.requires_grad))
        exchange = _TokenExchange(mesh.get_group(), size, experts.num_experts // size)
        experts.num_experts //= size  # what the module's own forward computes: this rank's experts
        experts.register_forward_pre_hook(exchange.dispatch)
        experts.register_forward_hook(exchange.combine)
        _EXCHANGES[experts] = exchange
    log.info(
        "Expert parallelism over %d ranks: %d MoE layers, %d experts per rank.",
        size,
        len(layers),
        layers[0].experts.num_experts,
    )
    return model


def expert_parallel_modules(model: nn.Module) -> list[nn.Module]:
    """The expert modules of ``model`` that :func:`apply_expert_parallel` converted, in module order."""
    return [module for module in model.modules() if module in _EXCHANGES]


class _TokenExchange:
    """The forward hooks of one expert-parallel expert module: sends each token slot to the rank owning its expert
    (pre-hook), and brings the results back and sums them per token (post-hook)."""

    def __init__(self, group: Any, num_ranks: int, local_experts: int) -> None:
        self.group = group
        self.num_ranks = num_ranks
        self.local_experts = local_experts
        self._pending: list[tuple[torch.Tensor, list[int], list[int], torch.Size]] = []

    def dispatch(self, module: nn.Module, args: tuple) -> tuple:
        x, weights, indices = args  # [num_tokens, dim], [num_tokens, k], [num_tokens, k] (global expert indices)
        k = indices.shape[-1]
        flat = indices.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, hence by owning rank
        token = order // k
        per_expert = torch.zeros(self.num_ranks * self.local_experts, dtype=torch.long, device=flat.device)
        per_expert.scatter_add_(0, flat, torch.ones_like(flat))
        # [num_ranks * local_experts] -> from each source rank, how many slots for each of this rank's experts
        received = torch.empty_like(per_expert)
        dist.all_to_all_single(received, per_expert, group=self.group)
        send_splits = per_expert.view(self.num_ranks, -1).sum(dim=1).tolist()
        received = received.view(self.num_ranks, self.local_experts)
        recv_splits = received.sum(dim=1).tolist()
        rows = _AllToAll.apply(x[token], send_splits, recv_splits, self.group)
        slot_weights = _AllToAll.apply(weights.reshape(-1)[order].unsqueeze(-1), send_splits, recv_splits, self.group)
        # the received rows come by source rank, then by expert: local expert j repeated as often as it was sent
        local = torch.arange(self.local_experts, device=flat.device).repeat(self.num_ranks)
        local_indices = torch.repeat_interleave(local, received.reshape(-1)).unsqueeze(-1)  # [num_received, 1]
        self._pending.append((token, send_splits, recv_splits, x.shape))
        return rows, slot_weights, local_indices

    def combine(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        # out: [num_received, dim], each received slot's weighted expert output, in the order it arrived
        token, send_splits, recv_splits, shape = self._pending.pop()
        back = _AllToAll.apply(out, recv_splits, send_splits, self.group)  # [num_tokens * k, dim], sorted slots
        return torch.zeros(shape, dtype=back.dtype, device=back.device).index_add_(0, token, back)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0 with the given split sizes; its backward sends the gradients back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send_splits: list[int], recv_splits: list[int], group: Any) -> torch.Tensor:
        ctx.send_splits, ctx.recv_splits, ctx.group = send_splits, recv_splits, group
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        grad_in = grad.new_empty((sum(ctx.send_splits), *grad.shape[1:]))
        dist.all_to_all_single(grad_in, grad.contiguous(), ctx.send_splits, ctx.recv_splits, group=ctx.group)
        return grad_in, None, None, None
