"""NF4 base weights for QLoRA (Dettmers et al., 2023, https://arxiv.org/abs/2305.14314), through torchao.

``LoRALinear`` and ``DoRALinear`` store their frozen base weight as a torchao ``NF4Tensor`` when built with
``quantize_base=True``; torchao is imported only then.
"""

import torch
from torch import nn

from tune.utils import import_optional

# NF4 quantises blocks of 64 values, each with one absmax scale (QLoRA, section 3; torchao's default).
_NF4_BLOCK_SIZE = 64
# The per-block scales are quantised again in groups of up to 256 ("double quantisation", QLoRA section 3).
_NF4_MAX_SCALER_BLOCK_SIZE = 256


def is_nf4_tensor(tensor: torch.Tensor) -> bool:
    """Tells whether ``tensor`` is a torchao ``NF4Tensor``, without importing torchao.

    Args:
        tensor (torch.Tensor): any tensor or parameter.

    Returns:
        bool: True for an NF4-quantised tensor.
    """
    # An nn.Parameter wrapping a tensor subclass keeps the subclass's type, so the class check covers both.
    return any(cls.__name__ == "NF4Tensor" for cls in type(tensor).__mro__)


def to_nf4(weight: torch.Tensor) -> torch.Tensor:
    """Quantises a weight to 4-bit NormalFloat with double-quantised block scales (torchao ``NF4Tensor``).

    Blocks hold 64 values (QLoRA's choice). The block scales are grouped for their second quantisation in the
    largest group size up to 256 that divides their count, so small test layers quantise too (torchao's default
    of 256 needs ``numel`` to be a multiple of 16384).

    Args:
        weight (torch.Tensor): a floating-point weight whose number of elements is a multiple of 64.

    Returns:
        torch.Tensor: the ``NF4Tensor``; it reports ``weight``'s dtype and shape, and ``.to(dtype)`` or
        :func:`dequantize` gives the dense approximation back.

    Raises:
        ValueError: if ``weight.numel()`` is not a multiple of 64.
        ImportError: if torchao is not installed.
    """
    if weight.numel() % _NF4_BLOCK_SIZE != 0:
        raise ValueError(
            f"NF4 quantisation needs the weight's number of elements to be a multiple of {_NF4_BLOCK_SIZE}, got "
            f"shape {tuple(weight.shape)} ({weight.numel()} elements). Quantise only layers whose in_dim * out_dim "
            "is a multiple of 64, or pass quantize_base=False."
        )
    quantization = import_optional("torchao.quantization", "QLoRA (quantize_base=True)")
    num_blocks = weight.numel() // _NF4_BLOCK_SIZE
    scaler_block_size = max(
        size for size in range(1, min(num_blocks, _NF4_MAX_SCALER_BLOCK_SIZE) + 1) if num_blocks % size == 0
    )
    return quantization.to_nf4(weight, _NF4_BLOCK_SIZE, scaler_block_size)


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """Returns a dense tensor for ``weight``: NF4 tensors are dequantised, others returned as they are.

    Args:
        weight (torch.Tensor): a plain or NF4 tensor (or a parameter holding one).

    Returns:
        torch.Tensor: a plain tensor in the weight's reported dtype.
    """
    if is_nf4_tensor(weight):
        # torchao may dequantise in the dtype it quantised from; return the dtype the tensor reports.
        return weight.get_original_weight().to(weight.dtype)
    return weight


def quantize_loaded_base_weight(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict, *args) -> None:
    """Load pre-hook of quantised layers: a dense ``weight`` in the checkpoint is quantised to NF4 first.

    The fresh NF4 parameter replaces the module's one outright instead of being copied into it, because an NF4
    tensor that went through ``to_empty()`` keeps parts of itself on the meta device (torchao 0.18), so loading
    works the same after building on the meta device, with or without ``assign=True``. As ``load_state_dict``
    does, ``assign=True`` keeps the checkpoint's dtype and device and a plain load keeps the module's.
    """
    key = prefix + "weight"
    incoming = state_dict.get(key)
    if incoming is None or is_nf4_tensor(incoming):
        return
    current = module.weight
    assign = local_metadata.get("assign_to_params_buffers", False) or current.device.type == "meta"
    device, dtype = (incoming.device, incoming.dtype) if assign else (current.device, current.dtype)
    quantized = to_nf4(incoming.detach().to(device=device, dtype=dtype))
    module.weight = nn.Parameter(quantized, requires_grad=False)
    state_dict[key] = quantized
