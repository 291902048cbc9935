"""DoRA: weight-decomposed low-rank adaptation (Liu et al., 2024, https://arxiv.org/abs/2402.09353).

The adapted weight is ``m * (W + s B A) / ||W + s B A||_c``: the direction comes from the LoRA-updated weight and
the per-output-row magnitude ``m`` is trained separately. As in the paper (section 4.3) and Hugging Face PEFT,
the norm is treated as a constant (detached) in the backward pass. The numerics follow PEFT's ``DoraLinearLayer``
so adapters move between the two without changing outputs.
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft._lora import _check_lora_args
from tune.modules.peft._nf4 import dequantize, quantize_loaded_base_weight, to_nf4


class DoRALinear(nn.Module):
    """A linear layer with a frozen base weight, a LoRA update and a trainable per-row magnitude.

    ``y = (m / ||W + s B A||_c) * (x W^T + s B(A(x))) + b`` with ``s = alpha / rank``, ``A = lora_a``
    (Kaiming-uniform), ``B = lora_b`` (zeros) and ``m = magnitude`` initialised to the row norms of ``W``
    (``||W||_c``, so a fresh adapter leaves the output unchanged). The norm is detached from the graph. With
    dropout active in training, the rescaled base term uses the dropped input, as PEFT does:
    ``y = x W^T + b + (m/n - 1) * (d(x) W^T) + (m/n) * s * B(A(d(x)))``.

    State-dict keys: ``weight`` (and ``bias``) as in ``nn.Linear``, ``lora_a.weight``, ``lora_b.weight``,
    ``magnitude``. After loading base weights into a model built on the meta device, call
    :meth:`initialize_dora_magnitude`.

    Args:
        in_dim (int): input features.
        out_dim (int): output features.
        rank (int): rank of the update, > 0.
        alpha (float): scale numerator; the update is multiplied by ``alpha / rank``.
        dropout (float): dropout probability on the adapter's input, in [0, 1). Default 0.0.
        use_bias (bool): whether the base layer has a bias. Default False.
        quantize_base (bool): store the base weight in NF4 through torchao (QDoRA). Default False.
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
        self.disabled = False

        base = nn.Linear(in_dim, out_dim, bias=use_bias)
        weight = to_nf4(base.weight.detach(), **quantization_kwargs) if quantize_base else base.weight.detach()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach(), requires_grad=False) if use_bias else None
        self.dropout = nn.Dropout(p=dropout) if dropout > 0.0 else nn.Identity()
        self.lora_a = nn.Linear(in_dim, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_dim, bias=False)
        self.magnitude = nn.Parameter(torch.empty(out_dim))
        if quantize_base:
            self.register_load_state_dict_pre_hook(quantize_loaded_base_weight)
        self.initialize_parameters()
        self.initialize_dora_magnitude()

    def initialize_parameters(self) -> None:
        """(Re)initialises ``lora_a`` (Kaiming-uniform, ``a = sqrt(5)``) and ``lora_b`` (zeros).

        The magnitude depends on the base weight: set it with :meth:`initialize_dora_magnitude` once the base
        weight is loaded.
        """
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)

    @torch.no_grad()
    def initialize_dora_magnitude(self) -> None:
        """Sets ``magnitude`` to the row norms of the current adapted weight ``||W + s B A||_c``.

        With ``B = 0`` (a fresh adapter) that is ``||W||_c``, the DoRA paper's initialisation.
        """
        self.magnitude.copy_(self._weight_norm().to(self.magnitude.dtype))

    def adapter_params(self) -> list[str]:
        """Names (relative to this module) of the trainable adapter parameters.

        Returns:
            list[str]: ``["lora_a.weight", "lora_b.weight", "magnitude"]``.
        """
        return ["lora_a.weight", "lora_b.weight", "magnitude"]

    def lora_delta(self) -> torch.Tensor:
        """The dense LoRA update ``(alpha / rank) * B @ A``.

        Returns:
            torch.Tensor: ``[out_dim, in_dim]`` in the adapters' dtype.
        """
        return self.scaling * (self.lora_b.weight @ self.lora_a.weight)

    def _weight_norm(self) -> torch.Tensor:
        # [out_dim]: L2 norm of each output row of W + s B A, detached (DoRA section 4.3).
        base = dequantize(self.weight).detach()
        adapted = base + self.lora_delta().detach().to(base.dtype)
        return torch.linalg.norm(adapted, dim=1).to(base.dtype)

    def merged_weight(self) -> torch.Tensor:
        """The plain weight an ``nn.Linear`` needs to compute what this layer computes (without dropout).

        Returns:
            torch.Tensor: ``(m / ||W + s B A||_c)[:, None] * (W + s B A)``, ``[out_dim, in_dim]``, in the base
            weight's dtype (dequantised when the base is NF4).
        """
        base = dequantize(self.weight)
        compute = torch.promote_types(base.dtype, torch.float32)  # merge in >= fp32, round once at the end
        adapted = base.to(compute) + self.lora_delta().to(compute)
        scale = self.magnitude.to(compute) / torch.linalg.norm(adapted.detach(), dim=1)
        return (scale.view(-1, 1) * adapted).to(base.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, out_dim={self.out_dim}, rank={self.rank}, alpha={self.alpha}, "
            f"use_bias={self.use_bias}, quantize_base={self._quantize_base}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Applies the magnitude-rescaled base plus LoRA update.

        Args:
            x (torch.Tensor): ``[..., in_dim]``.

        Returns:
            torch.Tensor: ``[..., out_dim]``.
        """
        base_out = F.linear(x, self.weight)  # [..., out_dim], without bias
        if self.disabled:
            return base_out if self.bias is None else base_out + self.bias
        dropped = self.dropout(x)
        # Without active dropout the dropped input is x itself, so the base product is reused.
        if isinstance(self.dropout, nn.Identity) or not self.training:
            dropped_base = base_out
        else:
            dropped_base = F.linear(dropped, self.weight)
        mag_norm_scale = self.magnitude / self._weight_norm()  # [out_dim]
        lora_out = self.lora_b(self.lora_a(dropped))
        out = base_out + (mag_norm_scale - 1) * dropped_base + mag_norm_scale * lora_out * self.scaling
        return out if self.bias is None else out + self.bias
