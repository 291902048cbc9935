"""A stack of SwiGLU experts and the token dispatch shared by its two compute paths.

Layout (the same per expert as ``nn.Linear``, ``[out, in]``): ``gate_proj`` and ``up_proj`` are
``[num_experts, hidden_dim, dim]``, ``down_proj`` is ``[num_experts, dim, hidden_dim]``. Expert ``e`` computes
``down_proj[e] @ (silu(gate_proj[e] @ x) * (up_proj[e] @ x))``: the hub checkpoints' per-expert tensors stacked,
and transformers' fused ``gate_up_proj`` split in two.

The token slots (token, chosen expert) are sorted by expert, so each expert sees one contiguous block of rows;
then either a Python loop multiplies each block by its expert's matrix (exact, any shape, a host sync for the
block sizes) or ``torch._grouped_mm`` does all blocks in one call (no host sync). Every token is processed by
all its k experts: there is no capacity factor and no token is dropped.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.low_precision import dequantize, is_nf4_tensor, to_nf4

# torch._grouped_mm needs every row of its operands to start on a 16-byte boundary (checked on CPU in torch 2.13;
# CUDA asks the same), so each matrix dimension times the element size must be a multiple of 16.
_GROUPED_MM_ALIGNMENT_BYTES = 16


class SwiGLUExperts(nn.Module):
    """``num_experts`` SwiGLU feed-forward networks stored as stacked weights (layout in the module docstring).

    Weights are initialised per expert as ``nn.Linear`` does (uniform in ``±1/sqrt(fan_in)``); normally a
    checkpoint is loaded over them. With ``quantize_base`` they are frozen and stored in NF4 (QLoRA's storage,
    Dettmers et al., 2023, https://arxiv.org/abs/2305.14314), each flattened to ``[num_experts * out, in]``
    (torchao's NF4 is 2-D); a dense ``[num_experts, out, in]`` checkpoint weight is quantised on load, and the
    state dict then holds the flat shape.

    Args:
        dim (int): model width (input and output of every expert).
        hidden_dim (int): each expert's hidden width (Qwen3-MoE's ``moe_intermediate_size``).
        num_experts (int): number of experts.
        use_grouped_mm (bool): compute with ``torch._grouped_mm`` instead of a loop over experts; needs
            ``dim * element_size`` and ``hidden_dim * element_size`` to be multiples of 16 bytes. Also an
            attribute, changeable after construction. Default False.
        quantize_base (bool): store the (frozen) weights in NF4 through torchao. Default False.
        weight_inputs (bool): multiply each token's INPUT to an expert by its router weight, instead of the
            expert's output (Llama 4: ``expert(w * x)``, not ``w * expert(x)``; the two differ, SwiGLU not being
            linear). Also an attribute, changeable after construction. Default False.

    Raises:
        ValueError: for non-positive sizes.
    """

    _weight_names = ("gate_proj", "up_proj", "down_proj")

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        use_grouped_mm: bool = False,
        quantize_base: bool = False,
        weight_inputs: bool = False,
    ) -> None:
        super().__init__()
        if min(dim, hidden_dim, num_experts) <= 0:
            raise ValueError(
                f"dim, hidden_dim and num_experts must be positive, got {dim}, {hidden_dim}, {num_experts}."
            )
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.num_experts = num_experts
        self.use_grouped_mm = use_grouped_mm
        self.weight_inputs = weight_inputs
        self.gate_proj = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.up_proj = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.reset_parameters()
        self._quantize_base = quantize_base
        if quantize_base:
            for name in self._weight_names:
                weight = getattr(self, name).detach()
                setattr(self, name, nn.Parameter(to_nf4(weight.reshape(-1, weight.shape[-1])), requires_grad=False))
            self.register_load_state_dict_pre_hook(_quantize_loaded_experts)

    def reset_parameters(self) -> None:
        """Initialises each expert's matrices as ``nn.Linear`` would: uniform in ``±1/sqrt(fan_in)``."""
        for weight in (self.gate_proj, self.up_proj, self.down_proj):
            if is_nf4_tensor(weight):
                continue  # a quantised base weight comes from the checkpoint
            bound = 1.0 / math.sqrt(weight.shape[-1])
            nn.init.uniform_(weight, -bound, bound)

    def expert_weight(self, name: str) -> torch.Tensor:
        """The dense ``[num_experts, out, in]`` weight ``name`` (``gate_proj``, ``up_proj`` or ``down_proj``);
        an NF4 weight (stored flat as ``[num_experts * out, in]``) is dequantised."""
        weight = self.local_param(name)
        if is_nf4_tensor(weight):
            weight = dequantize(weight).view(self.num_experts, -1, weight.shape[-1])
        return weight

    def local_param(self, name: str) -> torch.Tensor:
        """The parameter ``name`` as this module computes with it: the parameter itself, or, under expert
        parallelism (``tune.training.apply_expert_parallel``, which holds it as a DTensor split by expert and
        sets ``num_experts`` to the local count), the experts of this rank (``DTensor.to_local``, differentiable).
        The exchange of tokens between ranks happens outside the module, in forward hooks."""
        param = getattr(self, name)
        return param.to_local() if hasattr(param, "to_local") else param

    def forward(self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Runs every token through its chosen experts and sums their outputs with the router's weights.

        Args:
            x (torch.Tensor): ``[num_tokens, dim]``.
            weights (torch.Tensor): ``[num_tokens, k]`` mixing weights.
            indices (torch.Tensor): ``[num_tokens, k]`` expert indices.

        Returns:
            torch.Tensor: ``[num_tokens, dim]``.
        """
        k = indices.shape[-1]
        flat = indices.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, in token order within a group
        token = order // k  # [num_tokens * k]: the token of each sorted slot
        counts = count_per_expert(flat, self.num_experts)
        if self.use_grouped_mm:
            groups: torch.Tensor | list[int] = torch.cumsum(counts, dim=0).to(torch.int32)  # group end offsets
        else:
            groups = counts.tolist()
        rows = x[token]  # [num_tokens * k, dim]
        slot_weights = weights.reshape(-1)[order].unsqueeze(-1)  # [num_tokens * k, 1]
        if self.weight_inputs:
            rows = rows * slot_weights.to(rows.dtype)
        hidden = F.silu(self._project("gate_proj", rows, groups)) * self._project("up_proj", rows, groups)
        out = self._project("down_proj", hidden, groups)  # [num_tokens * k, dim]
        if not self.weight_inputs:
            out = out * slot_weights.to(out.dtype)
        return torch.zeros_like(x).index_add_(0, token, out.to(x.dtype))

    def _project(self, name: str, rows: torch.Tensor, groups: torch.Tensor | list[int]) -> torch.Tensor:
        # rows sorted by expert -> rows @ W[e]^T for each expert's block
        return grouped_linear(rows, self.expert_weight(name), groups)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, hidden_dim={self.hidden_dim}, num_experts={self.num_experts}, "
            f"use_grouped_mm={self.use_grouped_mm}"
        )


def count_per_expert(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many entries of ``indices`` name each expert, ``[num_experts]`` int64, without a host sync
    (``torch.bincount`` reads the largest index back to size its output on CUDA)."""
    flat = indices.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def _quantize_loaded_experts(module: SwiGLUExperts, state_dict: dict, prefix: str, local_metadata: dict, *args) -> None:
    # Load pre-hook of NF4 experts: a dense checkpoint weight ([E, out, in] or flat) is flattened and quantised, and
    # the fresh NF4 parameter replaces the module's (an NF4 tensor that went through `to_empty()` is partly on the
    # meta device, so it cannot be copied into).
    for name in module._weight_names:
        key = prefix + name
        incoming = state_dict.get(key)
        if incoming is None or is_nf4_tensor(incoming):
            continue
        current = getattr(module, name)
        assign = local_metadata.get("assign_to_params_buffers", False) or current.device.type == "meta"
        device, dtype = (incoming.device, incoming.dtype) if assign else (current.device, current.dtype)
        flat = incoming.detach().to(device=device, dtype=dtype).reshape(-1, incoming.shape[-1])
        quantized = to_nf4(flat)
        setattr(module, name, nn.Parameter(quantized, requires_grad=False))
        state_dict[key] = quantized


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, groups: torch.Tensor | list[int]) -> torch.Tensor:
    """``rows[block e] @ weight[e]^T`` for consecutive blocks of rows, one block per expert.

    Args:
        rows (torch.Tensor): ``[n, in]``, sorted so that expert ``e``'s rows form block ``e``.
        weight (torch.Tensor): ``[num_experts, out, in]``.
        groups (torch.Tensor | list[int]): the block sizes (a list: a loop of ``F.linear``), or the int32 end
            offsets of the blocks (a tensor: one ``torch._grouped_mm``).

    Returns:
        torch.Tensor: ``[n, out]``.

    Raises:
        ValueError: when ``torch._grouped_mm``'s 16-byte row alignment does not hold for these shapes.
    """
    if isinstance(groups, list):
        # unbind, not weight[e]: indexing makes autograd add one zero-filled [E, out, in] gradient per expert
        return torch.cat([F.linear(block, w) for block, w in zip(torch.split(rows, groups), weight.unbind(0))])
    size = rows.element_size()
    if (weight.shape[-1] * size) % _GROUPED_MM_ALIGNMENT_BYTES or (
        weight.shape[-2] * size
    ) % _GROUPED_MM_ALIGNMENT_BYTES:
        raise ValueError(
            f"torch._grouped_mm needs matrix dimensions whose size in bytes is a multiple of "
            f"{_GROUPED_MM_ALIGNMENT_BYTES}; got an expert weight of shape {tuple(weight.shape[-2:])} in {rows.dtype}. "
            "Use the loop path (use_grouped_mm=False) or dimensions that are multiples of "
            f"{_GROUPED_MM_ALIGNMENT_BYTES // size}."
        )
    return torch._grouped_mm(rows, weight.to(rows.dtype).transpose(-2, -1), offs=groups)
