"""NF4 base weights for QLoRA (Dettmers et al., 2023, https://arxiv.org/abs/2305.14314), through torchao.

``FrozenNF4Linear``, and ``LoRALinear`` and ``DoRALinear`` built with ``quantize_base=True``, store their frozen
weight as a torchao ``NF4Tensor``; torchao is imported only then.

FSDP2 splits an NF4 weight by rows, and torchao's split gives each rank an equal share of the weight's groups of
double-quantised block scales, so a weight shards over N ranks only when N divides both its rows and its number
of groups. :func:`nf4_block_sizes` sizes the groups so that small weights split over up to 8 ranks too, and
:func:`check_nf4_shardable` turns a weight that cannot split into one actionable error.
"""

import math
from collections.abc import Sequence

import torch
from torch import nn

from tune.utils import TuneError, import_optional

# NF4 quantises blocks of 64 values, each with one absmax scale (QLoRA, section 3; torchao's default).
_NF4_BLOCK_SIZE = 64
# The per-block scales are quantised again in groups of up to 256 ("double quantisation", QLoRA section 3;
# torchao's default).
_NF4_MAX_SCALER_BLOCK_SIZE = 256
# Groups of block scales are made small enough that every weight splits over up to this many FSDP ranks (a
# power of two: 1, 2, 4 or 8 ranks, one node) wherever its rows and blocks allow it.
_NF4_MAX_SHARDS = 8


class NF4ShardingError(TuneError, ValueError):
    """An NF4 (QLoRA) base weight that FSDP cannot split over the ranks; the message names the weight, its shape,
    the number of ranks and what to change. The CLI prints it as one ``error:`` line."""


def is_nf4_tensor(tensor: torch.Tensor) -> bool:
    """Tells whether ``tensor`` is a torchao ``NF4Tensor``, without importing torchao.

    Args:
        tensor (torch.Tensor): any tensor or parameter.

    Returns:
        bool: True for an NF4-quantised tensor.
    """
    # An nn.Parameter wrapping a tensor subclass keeps the subclass's type, so the class check covers both.
    return any(cls.__name__ == "NF4Tensor" for cls in type(tensor).__mro__)


def nf4_block_sizes(shape: Sequence[int]) -> tuple[int, int]:
    """The NF4 ``(block_size, scaler_block_size)`` that :func:`to_nf4` uses for a weight of ``shape``.

    Blocks always hold 64 values. Their scales are double-quantised in groups of 256 (QLoRA's and torchao's
    sizes) whenever that gives a number of groups that FSDP can split over every rank count up to 8 dividing the
    weight's rows, which holds for the layers of real-size models (a 2048 x 2048 weight has 256 groups).
    Otherwise (small weights) the groups are the largest, up to 256 scales, whose number is a multiple of the
    largest power of two up to 8 that divides both the rows and the number of blocks: a 64 x 64 weight has 64
    blocks in 8 groups of 8, so it splits over 2, 4 or 8 ranks. The choice depends on the shape alone, so a
    sharded model quantises exactly as a single-device one.

    Args:
        shape (Sequence[int]): the weight's shape (1-D or 2-D; FSDP splits dim 0).

    Returns:
        tuple[int, int]: values per block, and block scales per group of the second quantisation.

    Raises:
        ValueError: if the number of elements is not a multiple of 64.
    """
    numel = math.prod(shape)
    if numel == 0 or numel % _NF4_BLOCK_SIZE != 0:
        raise ValueError(
            f"NF4 quantisation needs the weight's number of elements to be a multiple of {_NF4_BLOCK_SIZE}, got "
            f"shape {tuple(shape)} ({numel} elements). Quantise only layers whose in_dim * out_dim is a multiple "
            "of 64, or pass quantize_base=False."
        )
    num_blocks = numel // _NF4_BLOCK_SIZE
    # rank counts that can hold whole rows and whole blocks divide this (a power of two)
    num_shards = math.gcd(shape[0], num_blocks, _NF4_MAX_SHARDS)
    scaler_block_size = max(
        size
        for size in range(1, min(num_blocks, _NF4_MAX_SCALER_BLOCK_SIZE) + 1)
        if num_blocks % size == 0 and (num_blocks // size) % num_shards == 0
    )
    return _NF4_BLOCK_SIZE, scaler_block_size


def to_nf4(weight: torch.Tensor, block_size: int | None = None, scaler_block_size: int | None = None) -> torch.Tensor:
    """Quantises a weight to 4-bit NormalFloat with double-quantised block scales (torchao ``NF4Tensor``).

    Blocks hold 64 values (QLoRA's choice); their scales are grouped for the second quantisation as
    :func:`nf4_block_sizes` says: in groups of 256 for real-size weights, smaller for small ones, so that FSDP
    can split them over several ranks.

    Args:
        weight (torch.Tensor): a 1-D or 2-D floating-point weight whose number of elements is a multiple of 64.
        block_size (int | None): values per block (torchao's ``block_size``); None for the sizes above.
        scaler_block_size (int | None): block scales per double-quantisation group (torchao's
            ``scaler_block_size``); None for the sizes above.

    Returns:
        torch.Tensor: the ``NF4Tensor``; it reports ``weight``'s dtype and shape, and ``.to(dtype)`` or
        :func:`dequantize` gives the dense approximation back.

    Raises:
        ValueError: if ``weight.numel()`` is not a multiple of 64.
        ImportError: if torchao is not installed.
    """
    default_block_size, default_scaler_block_size = nf4_block_sizes(weight.shape)
    block_size = default_block_size if block_size is None else block_size
    scaler_block_size = default_scaler_block_size if scaler_block_size is None else scaler_block_size
    quantization = import_optional("torchao.quantization", "QLoRA (quantize_base=True)")
    if not hasattr(quantization, "to_nf4"):  # torchao before 0.16 keeps it in torchao.dtypes
        quantization = import_optional("torchao.dtypes", "QLoRA (quantize_base=True)")
    return quantization.to_nf4(weight, block_size, scaler_block_size)


def check_nf4_shardable(name: str, weight: torch.Tensor, num_shards: int) -> None:
    """Checks that FSDP can split the NF4 weight ``name`` by rows over ``num_shards`` ranks.

    Each rank must hold whole rows and an equal share of the weight's groups of double-quantised block scales;
    torchao otherwise fails inside FSDP with a bare ``AssertionError``.

    Args:
        name (str): the parameter's name in the model, for the message.
        weight (torch.Tensor): an ``NF4Tensor`` (or a parameter holding one), possibly on the meta device.
        num_shards (int): the number of ranks FSDP splits it over.

    Raises:
        NF4ShardingError: if the rows or the groups do not split evenly.
    """
    rows, num_groups = weight.shape[0], weight.quantization_factor.numel()
    if rows % num_shards == 0 and num_groups % num_shards == 0:
        return
    fits = math.gcd(rows, num_groups)
    ranks_hint = f"use a number of ranks that divides {fits}" if fits > 1 else "train on a single device"
    raise NF4ShardingError(
        f"cannot shard the NF4 (QLoRA) base weight {name!r} of shape {tuple(weight.shape)} over {num_shards} ranks: "
        f"FSDP splits it into equal parts of whole rows (it has {rows}) and whole groups of quantisation scales (it "
        f"has {num_groups} group{'s' if num_groups > 1 else ''} of {weight.scaler_block_size} blocks of "
        f"{weight.block_size} values). To fix it, {ranks_hint}, leave this "
        "layer unquantised (quantize_base=False, or a lora_* builder instead of qlora_*), or use wider layers."
    )


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
    # the block sizes the layer was built with (its `quantization_kwargs`), if any
    quantized = to_nf4(incoming.detach().to(device=device, dtype=dtype), **getattr(module, "quantization_kwargs", {}))
    module.weight = nn.Parameter(quantized, requires_grad=False)
    state_dict[key] = quantized
