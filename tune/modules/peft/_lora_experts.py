"""LoRA on stacked experts: one low-rank update per expert and per projection, applied without forming it.

For expert ``e`` and projection ``W_e`` (``[out, in]``), the adapted projection is
``x W_e^T + (alpha / rank) * (x A_e^T) B_e^T`` with ``A`` ``[num_experts, rank, in]`` and ``B``
``[num_experts, out, rank]`` (Hu et al., 2021, https://arxiv.org/abs/2106.09685, applied expert by expert).
The two thin products run on each expert's block of rows, through the same loop or ``torch._grouped_mm`` as the
base weight, so the ``[num_experts, out, in]`` update is never materialised in the forward pass.

The adapter parameters are named ``<projection>_lora_a`` / ``<projection>_lora_b`` (``gate_proj_lora_a``, ...),
not ``<module>.lora_a.weight``: the generic merge and PEFT-export helpers treat ``lora_a.weight`` as one 2-D
matrix, which a stack of experts is not. Merge with :meth:`LoRASwiGLUExperts.merged_weights` or
:func:`merge_lora_experts`.
"""

import math
from collections.abc import Mapping

import torch
from torch import nn

from tune.modules.low_precision import dequantize
from tune.modules.moe import SwiGLUExperts, grouped_linear

__all__ = ["LoRASwiGLUExperts", "is_expert_adapter_key", "merge_lora_experts", "merge_lora_experts_state_dict"]


class LoRASwiGLUExperts(SwiGLUExperts):
    """:class:`~tune.modules.moe.SwiGLUExperts` with frozen base weights and a trainable LoRA update per expert on
    each of ``gate_proj``, ``up_proj`` and ``down_proj``.

    ``A`` starts Kaiming-uniform per expert (``a = sqrt(5)``, as ``LoRALinear``) and ``B`` at zero, so a fresh
    adapter leaves the output unchanged. ``disabled = True`` computes the base experts alone (``disable_adapter``).

    Args:
        dim (int): model width.
        hidden_dim (int): each expert's hidden width.
        num_experts (int): number of experts.
        rank (int): rank of each expert's update, > 0.
        alpha (float): scale numerator; updates are multiplied by ``alpha / rank``.
        use_grouped_mm (bool): as in ``SwiGLUExperts``; the rank must then also be 16-byte aligned (a multiple of
            4 in float32, 8 in bfloat16). Default False.
        quantize_base (bool): NF4 base weights (QLoRA). Default False.

    Raises:
        ValueError: for a non-positive rank or size.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        rank: int,
        alpha: float,
        use_grouped_mm: bool = False,
        quantize_base: bool = False,
    ) -> None:
        if rank <= 0:
            raise ValueError(f"LoRA rank must be a positive integer, got rank={rank}.")
        super().__init__(dim, hidden_dim, num_experts, use_grouped_mm=use_grouped_mm, quantize_base=quantize_base)
        for name in self._weight_names:
            getattr(self, name).requires_grad_(False)
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        self.disabled = False
        shapes = {"gate_proj": (hidden_dim, dim), "up_proj": (hidden_dim, dim), "down_proj": (dim, hidden_dim)}
        for name, (out_dim, in_dim) in shapes.items():
            self.register_parameter(f"{name}_lora_a", nn.Parameter(torch.empty(num_experts, rank, in_dim)))
            self.register_parameter(f"{name}_lora_b", nn.Parameter(torch.empty(num_experts, out_dim, rank)))
        self.initialize_parameters()

    def initialize_parameters(self) -> None:
        """(Re)initialises the adapters: each ``A`` Kaiming-uniform per expert, each ``B`` zeros."""
        for name in self._weight_names:
            lora_a = getattr(self, f"{name}_lora_a")
            # kaiming_uniform(a=sqrt(5)) of an [rank, in] matrix, as LoRALinear: uniform in ±1/sqrt(in)
            bound = 1.0 / math.sqrt(lora_a.shape[-1])
            nn.init.uniform_(lora_a, -bound, bound)
            nn.init.zeros_(getattr(self, f"{name}_lora_b"))

    def adapter_params(self) -> list[str]:
        """Names of the trainable adapter parameters (``gate_proj_lora_a``, ``gate_proj_lora_b``, ...).

        Returns:
            list[str]: six names.
        """
        return [f"{name}_lora_{part}" for name in self._weight_names for part in ("a", "b")]

    def lora_delta(self, name: str) -> torch.Tensor:
        """The dense update ``(alpha / rank) * B_e @ A_e`` of projection ``name`` for every expert.

        Returns:
            torch.Tensor: ``[num_experts, out, in]`` in the adapters' dtype.
        """
        return self.scaling * torch.bmm(self.local_param(f"{name}_lora_b"), self.local_param(f"{name}_lora_a"))

    def merged_weights(self) -> dict[str, torch.Tensor]:
        """The plain expert weights that compute what this module computes.

        Returns:
            dict[str, torch.Tensor]: ``gate_proj``, ``up_proj``, ``down_proj`` as ``[num_experts, out, in]``, in the
            base weights' dtype (dequantised when NF4); the merge runs in at least float32.
        """
        merged = {}
        for name in self._weight_names:
            base = self.expert_weight(name)
            compute = torch.promote_types(base.dtype, torch.float32)
            merged[name] = (base.to(compute) + self.lora_delta(name).to(compute)).to(base.dtype)
        return merged

    def _project(self, name: str, rows: torch.Tensor, groups: torch.Tensor | list[int]) -> torch.Tensor:
        out = grouped_linear(rows, self.expert_weight(name), groups)
        if self.disabled:
            return out
        lora_a = self.local_param(f"{name}_lora_a").to(rows.dtype)
        lora_b = self.local_param(f"{name}_lora_b").to(rows.dtype)
        return out + self.scaling * grouped_linear(grouped_linear(rows, lora_a, groups), lora_b, groups)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}, quantize_base={self._quantize_base}"


@torch.no_grad()
def merge_lora_experts(model: nn.Module) -> nn.Module:
    """Replaces every :class:`LoRASwiGLUExperts` in ``model`` by a plain ``SwiGLUExperts`` with the merged
    weights, in place (the expert counterpart of ``merge_lora_weights``).

    Args:
        model (nn.Module): a model holding LoRA experts.

    Returns:
        nn.Module: ``model``; the merged experts are frozen as the base was.
    """
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, LoRASwiGLUExperts)]
    for name, layer in targets:
        merged = layer.merged_weights()
        plain = SwiGLUExperts(layer.dim, layer.hidden_dim, layer.num_experts, use_grouped_mm=layer.use_grouped_mm)
        plain.weight_inputs = layer.weight_inputs  # where the router weight applies (Llama 4: the input)
        for key, weight in merged.items():
            setattr(plain, key, nn.Parameter(weight.detach().clone(), requires_grad=False))
        plain.train(layer.training)
        model.set_submodule(name, plain)
    return model


# State-dict keys of the expert adapters: `<experts>.<projection>_lora_a` / `_lora_b` (see the module docstring).
_EXPERT_ADAPTER_SUFFIXES = ("_lora_a", "_lora_b")


def is_expert_adapter_key(key: str) -> bool:
    """Whether ``key`` names an adapter parameter of :class:`LoRASwiGLUExperts` (``...experts.gate_proj_lora_a``).

    Args:
        key (str): a state-dict key.

    Returns:
        bool: True for the 3-D expert adapters.
    """
    return key.endswith(_EXPERT_ADAPTER_SUFFIXES)


@torch.no_grad()
def merge_lora_experts_state_dict(
    state_dict: Mapping[str, torch.Tensor], alpha: float, rank: int | None = None
) -> dict[str, torch.Tensor]:
    """Folds the expert adapters of a state dict into their expert weights (the state-dict counterpart of
    :func:`merge_lora_experts`): ``W_e + (alpha / rank) * B_e @ A_e`` for every expert ``e`` of every adapted
    projection. Other keys pass through unchanged (2-D LoRA adapters included).

    An NF4 base weight (stored flat, ``[num_experts * out, in]``) is dequantised and returned as
    ``[num_experts, out, in]``. The merge runs in at least float32 and the result takes the base weight's dtype.

    Args:
        state_dict (Mapping[str, torch.Tensor]): a model state dict with ``<proj>_lora_a`` / ``<proj>_lora_b``
            keys next to their base ``<proj>``.
        alpha (float): the adapters' alpha.
        rank (int | None): the adapters' rank, checked against the ``A`` shapes; None reads it from them.

    Returns:
        dict[str, torch.Tensor]: the state dict without expert adapter keys.

    Raises:
        ValueError: for an adapter without its partner or base weight, or a rank other than ``rank``.
    """
    merged = {k: v for k, v in state_dict.items() if not is_expert_adapter_key(k)}
    for key in state_dict:
        if not key.endswith("_lora_a"):
            continue
        base_key = key[: -len("_lora_a")]
        lora_a, lora_b = state_dict[key], state_dict.get(base_key + "_lora_b")
        if lora_b is None or base_key not in state_dict:
            raise ValueError(
                f"Expert adapter {key!r} has no matching {base_key + '_lora_b'!r} or base weight {base_key!r} in the "
                "state dict. Pass the full model state dict (model.state_dict()), not the adapter-only one."
            )
        if rank is not None and lora_a.shape[1] != rank:
            raise ValueError(f"Expert adapter {key!r} has rank {lora_a.shape[1]} but rank={rank} was given.")
        base = dequantize(state_dict[base_key])
        compute = torch.promote_types(base.dtype, torch.float32)
        delta = (alpha / lora_a.shape[1]) * torch.bmm(lora_b.to(compute), lora_a.to(compute))  # [E, out, in]
        merged[base_key] = (base.to(compute).reshape(delta.shape) + delta).to(base.dtype)
    return merged
