"""A frozen linear layer whose weight is stored in NF4, and the state-dict hook that writes NF4 weights out dense."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.low_precision._nf4 import dequantize, is_nf4_tensor, quantize_loaded_base_weight, to_nf4


class FrozenNF4Linear(nn.Linear):
    """An ``nn.Linear`` with a frozen weight quantised to 4-bit NormalFloat (QLoRA's storage for base weights).

    The weight (and the bias, if any) never receives gradients; the input does, so the layer can sit inside a
    model whose other parts train. ``forward`` is ``F.linear`` on the NF4 weight, which torchao dequantises on
    the fly. Loading a dense ``weight`` from a checkpoint quantises it with the same block sizes.

    Args:
        in_dim (int): input features.
        out_dim (int): output features; ``in_dim * out_dim`` must be a multiple of 64 (NF4's block).
        bias (bool): add a (frozen, dense) bias. Default False.
        device (torch.device | None): where to allocate. Default: the current default device.
        dtype (torch.dtype | None): the dtype the weight reports and dequantises to. Default: the default dtype.
        **quantization_kwargs: torchao ``to_nf4`` block sizes, ``block_size`` and ``scaler_block_size``; by
            default the sizes :func:`~tune.modules.peft.nf4_block_sizes` picks for the weight's shape.

    Raises:
        ValueError: if the weight's number of elements is not a multiple of 64.
        ImportError: if torchao is not installed.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        bias: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        **quantization_kwargs: Any,
    ) -> None:
        super().__init__(in_dim, out_dim, bias=bias, device=device, dtype=dtype)
        self.quantization_kwargs = dict(quantization_kwargs)
        self.weight = nn.Parameter(to_nf4(self.weight.detach(), **self.quantization_kwargs), requires_grad=False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.register_load_state_dict_pre_hook(quantize_loaded_base_weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``[..., in_dim] -> [..., out_dim]``, dequantising the weight on the fly."""
        return F.linear(input, self.weight, self.bias)


def reparametrize_as_dtype_state_dict_post_hook(
    model: nn.Module,
    state_dict: dict[str, Any],
    *args: Any,
    dtype: torch.dtype = torch.bfloat16,
    offload_to_cpu: bool = True,
    **kwargs: Any,
) -> None:
    """A ``state_dict`` post-hook that replaces every NF4 tensor by a dense one of ``dtype``, in place.

    Register it with ``model._register_state_dict_hook(partial(reparametrize_as_dtype_state_dict_post_hook,
    dtype=..., offload_to_cpu=...))`` so that ``model.state_dict()`` of a QLoRA model holds plain weights a
    checkpoint can store. Other entries are left as they are.

    Args:
        model (nn.Module): the module whose ``state_dict()`` was taken (unused; part of the hook signature).
        state_dict (dict[str, Any]): the state dict to change.
        *args (Any): further hook arguments (unused).
        dtype (torch.dtype): the dtype of the dense weights. Default ``torch.bfloat16``.
        offload_to_cpu (bool): move the dense weights to the CPU. Default True.
        **kwargs (Any): further hook keyword arguments (unused).
    """
    for key, value in state_dict.items():
        if is_nf4_tensor(value):
            dense = dequantize(value).to(dtype)
            state_dict[key] = dense.cpu() if offload_to_cpu else dense
