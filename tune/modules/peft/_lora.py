"""LoRA: a frozen linear layer plus a trainable low-rank update (Hu et al., 2021, https://arxiv.org/abs/2106.09685).

``LoRALinear`` keeps the frozen base ``weight`` (and ``bias``) directly on the module, so its state-dict keys are
the ones of ``nn.Linear`` plus ``lora_a.weight`` and ``lora_b.weight``: base checkpoints load into a LoRA model
unchanged. With ``quantize_base=True`` the base weight is stored in NF4 (QLoRA, Dettmers et al., 2023,
https://arxiv.org/abs/2305.14314) through torchao, imported only when it is asked for (see ``_nf4``).

``forward`` writes out the paper's formula. By default it hands the same computation to ``_lora_fast``, a fused
forward and hand-written backward that run faster on CPU (the why and when are in that module); setting
``use_fast_path = False`` on a layer runs the formula as written, with the same numbers up to float32 rounding.
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import _lora_fast
from tune.modules.peft._nf4 import dequantize, quantize_loaded_base_weight, to_nf4

__all__ = ["LoRALinear"]


class LoRALinear(nn.Module):
    """A linear layer with a frozen base weight and a trainable rank-``rank`` update.

    ``y = x W^T + b + (alpha / rank) * B(A(dropout(x)))`` with ``A = lora_a`` (``in_dim -> rank``) and
    ``B = lora_b`` (``rank -> out_dim``). ``A`` starts Kaiming-uniform (``a = sqrt(5)``, as ``nn.Linear``'s default
    and the LoRA paper's reference code) and ``B`` starts at zero, so a fresh adapter leaves the output unchanged.
    The base ``weight`` and ``bias`` are frozen (``requires_grad=False``) and initialised like ``nn.Linear`` so
    the layer works on its own; normally a checkpoint is loaded over them.

    Two attributes change what ``forward`` runs: ``disabled = True`` computes the base layer alone (see
    ``disable_adapter``), and ``use_fast_path = False`` computes the formula as written instead of its faster
    equivalent in ``tune.modules.peft._lora_fast`` (for tests and debugging; the default True is what recipes run).

    Args:
        in_dim (int): input features.
        out_dim (int): output features.
        rank (int): rank of the update, > 0.
        alpha (float): scale numerator; the update is multiplied by ``alpha / rank``.
        dropout (float): dropout probability on the adapter's input, in [0, 1). Default 0.0.
        use_bias (bool): whether the base layer has a bias. Default False.
        quantize_base (bool): store the base weight in NF4 through torchao (QLoRA). Default False.
        **quantization_kwargs: torchao ``to_nf4`` block sizes for the NF4 base weight, ``block_size`` and
            ``scaler_block_size``; by default the sizes ``nf4_block_sizes`` picks. Only with ``quantize_base``.

    Raises:
        ValueError: for a non-positive size or rank, a dropout outside [0, 1), or quantization arguments
            without ``quantize_base``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        use_bias: bool = False,
        quantize_base: bool = False,
        **quantization_kwargs: Any,
    ) -> None:
        super().__init__()
        _check_lora_args(in_dim, out_dim, rank, dropout)
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        self.use_bias = use_bias
        self._quantize_base = quantize_base
        if not quantize_base and any(quantization_kwargs.values()):
            raise ValueError(
                f"quantization arguments {quantization_kwargs} were given but quantize_base is False; set "
                "quantize_base=True to quantise the base weight, or drop them."
            )
        # torchao `to_nf4` block sizes, kept so a dense checkpoint weight is quantised the same way on load
        self.quantization_kwargs = dict(quantization_kwargs)
        # True runs the base layer only (e.g. reference-model log-probs in DPO); see `disable_adapter`.
        self.disabled = False
        # False runs the formula as written in `forward`, never the fused version of `_lora_fast`.
        self.use_fast_path = True

        base = nn.Linear(in_dim, out_dim, bias=use_bias)
        weight = to_nf4(base.weight.detach(), **quantization_kwargs) if quantize_base else base.weight.detach()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach(), requires_grad=False) if use_bias else None
        self.dropout = nn.Dropout(p=dropout) if dropout > 0.0 else nn.Identity()
        self.lora_a = nn.Linear(in_dim, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_dim, bias=False)
        if quantize_base:
            self.register_load_state_dict_pre_hook(quantize_loaded_base_weight)
        self.initialize_parameters()

    def initialize_parameters(self) -> None:
        """(Re)initialises the adapters: ``lora_a`` Kaiming-uniform, ``lora_b`` zeros.

        Call it after ``to_empty()`` when the model was built on the meta device; the base weight is left alone
        (it comes from the checkpoint).
        """
        # a = sqrt(5) is nn.Linear's default and what the LoRA reference implementation (loralib) uses.
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)

    def adapter_params(self) -> list[str]:
        """Names (relative to this module) of the trainable adapter parameters.

        Returns:
            list[str]: ``["lora_a.weight", "lora_b.weight"]``.
        """
        return ["lora_a.weight", "lora_b.weight"]

    def lora_delta(self) -> torch.Tensor:
        """The dense weight update ``(alpha / rank) * B @ A``.

        Returns:
            torch.Tensor: ``[out_dim, in_dim]`` in the adapters' dtype.
        """
        return self.scaling * (self.lora_b.weight @ self.lora_a.weight)

    def merged_weight(self) -> torch.Tensor:
        """The plain weight an ``nn.Linear`` needs to compute what this layer computes (without dropout).

        Returns:
            torch.Tensor: ``W + (alpha / rank) * B @ A``, ``[out_dim, in_dim]``, in the base weight's dtype
            (dequantised when the base is NF4).
        """
        base = dequantize(self.weight)
        compute = torch.promote_types(base.dtype, torch.float32)  # merge in >= fp32, round once at the end
        return (base.to(compute) + self.lora_delta().to(compute)).to(base.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, out_dim={self.out_dim}, rank={self.rank}, alpha={self.alpha}, "
            f"use_bias={self.use_bias}, quantize_base={self._quantize_base}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Applies the base layer plus the scaled low-rank update.

        Args:
            x (torch.Tensor): ``[..., in_dim]``.

        Returns:
            torch.Tensor: ``[..., out_dim]``.
        """
        if self.disabled:
            return F.linear(x, self.weight, self.bias)
        if self.use_fast_path and not torch.compiler.is_compiling() and _lora_fast.supports(self.lora_a, self.lora_b):
            # this formula, fused (faster backward on CPU): see _lora_fast. Not under torch.compile, which fuses
            # the written formula itself, and whose tracing of the hand-written backward (torch 2.11) lost the
            # adapters' gradients: compiled LoRA then barely trained
            flat_x = x.reshape(-1, self.in_dim)  # [n, in_dim]
            dropped = self.dropout(flat_x)  # x itself without dropout: both paths then read one input
            out = _lora_fast.lora_linear(
                flat_x,
                None if dropped is flat_x else dropped,
                self.weight,
                self.bias,
                self.lora_a.weight,
                self.lora_b.weight,
                self.scaling,
            )
            return out.view(*x.shape[:-1], self.out_dim)
        # LoRA paper, eq. (3); F.linear runs torchao's NF4 linear (dequantising on the fly) for an NF4 base weight
        return F.linear(x, self.weight, self.bias) + self.lora_b(self.lora_a(self.dropout(x))) * self.scaling


def _check_lora_args(in_dim: int, out_dim: int, rank: int, dropout: float) -> None:
    if in_dim <= 0 or out_dim <= 0:
        raise ValueError(f"in_dim and out_dim must be positive, got in_dim={in_dim}, out_dim={out_dim}.")
    if rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer, got rank={rank}. Typical values are 8 to 64.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1), got dropout={dropout}.")
