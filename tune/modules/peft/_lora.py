"""LoRA: a frozen linear layer plus a trainable low-rank update (Hu et al., 2021, https://arxiv.org/abs/2106.09685).

``LoRALinear`` keeps the frozen base ``weight`` (and ``bias``) directly on the module, so its state-dict keys are
the ones of ``nn.Linear`` plus ``lora_a.weight`` and ``lora_b.weight``: base checkpoints load into a LoRA model
unchanged. With ``quantize_base=True`` the base weight is stored in NF4 (QLoRA, Dettmers et al., 2023,
https://arxiv.org/abs/2305.14314) through torchao, imported only when it is asked for.
"""

import math

import torch
import torch.nn.functional as F
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


class LoRALinear(nn.Module):
    """A linear layer with a frozen base weight and a trainable rank-``rank`` update.

    ``y = x W^T + b + (alpha / rank) * B(A(dropout(x)))`` with ``A = lora_a`` (``in_dim -> rank``) and
    ``B = lora_b`` (``rank -> out_dim``). ``A`` starts Kaiming-uniform (``a = sqrt(5)``, as ``nn.Linear``'s default
    and the LoRA paper's reference code) and ``B`` starts at zero, so a fresh adapter leaves the output unchanged.
    The base ``weight`` and ``bias`` are frozen (``requires_grad=False``) and initialised like ``nn.Linear`` so
    the layer works on its own; normally a checkpoint is loaded over them.

    Args:
        in_dim (int): input features.
        out_dim (int): output features.
        rank (int): rank of the update, > 0.
        alpha (float): scale numerator; the update is multiplied by ``alpha / rank``.
        dropout (float): dropout probability on the adapter's input, in [0, 1). Default 0.0.
        use_bias (bool): whether the base layer has a bias. Default False.
        quantize_base (bool): store the base weight in NF4 through torchao (QLoRA). Default False.

    Raises:
        ValueError: for a non-positive size or rank, or a dropout outside [0, 1).
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
        # True runs the base layer only (e.g. reference-model log-probs in DPO); see `disable_adapter`.
        self.disabled = False

        base = nn.Linear(in_dim, out_dim, bias=use_bias)
        weight = to_nf4(base.weight.detach()) if quantize_base else base.weight.detach()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach(), requires_grad=False) if use_bias else None
        self.dropout = nn.Dropout(p=dropout) if dropout > 0.0 else nn.Identity()
        self.lora_a = nn.Linear(in_dim, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_dim, bias=False)
        if quantize_base:
            self.register_load_state_dict_pre_hook(_quantize_loaded_base_weight)
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
        # F.linear dispatches to torchao's NF4 linear (dequantise on the fly) when the weight is NF4.
        if self.disabled:
            return F.linear(x, self.weight, self.bias)
        if not _is_plain_linear(self.lora_b):
            # a replaced, hooked or sharded (DTensor) adapter module must be called as a module
            out = F.linear(x, self.weight, self.bias)
            return out + self.lora_b(self.lora_a(self.dropout(x))) * self.scaling
        flat_x = x.reshape(-1, self.in_dim)
        frozen_base = not self.weight.requires_grad and (self.bias is None or not self.bias.requires_grad)
        plain_or_nf4 = type(self.weight) in _PLAIN_TENSOR_TYPES or is_nf4_tensor(self.weight)
        if frozen_base and plain_or_nf4 and _is_plain_linear(self.lora_a):
            # one autograd node with a hand-written backward (see _LoRALinearFunction)
            dropped = self.dropout(flat_x)
            out = _LoRALinearFunction.apply(
                flat_x, None if dropped is flat_x else dropped, self.weight, self.bias, self.lora_a.weight,
                self.lora_b.weight, self.scaling,
            )
            return out.view(*x.shape[:-1], self.out_dim)
        out = F.linear(flat_x, self.weight, self.bias)  # [n, out_dim], a fresh tensor no backward needs
        # the scaling goes on the rank-sized activations, and B's product accumulates into the base output in the
        # same matmul: no [n, out_dim] temporaries for the update, its scaling or the sum
        update = self.lora_a(self.dropout(flat_x)) * self.scaling  # [n, rank]
        out.addmm_(update, self.lora_b.weight.t())
        return out.view(*x.shape[:-1], self.out_dim)


_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


def _is_plain_linear(module: nn.Module) -> bool:
    """A bias-free ``nn.Linear`` without hooks whose weight is a plain tensor (not a DTensor or another subclass)."""
    return (
        type(module) is nn.Linear
        and module.bias is None  # the fast paths use the weight alone
        and not (module._forward_hooks or module._forward_pre_hooks)
        and type(module.weight) in _PLAIN_TENSOR_TYPES
    )


class _LoRALinearFunction(torch.autograd.Function):
    """``x W^T + b + scaling * (dropped A^T) B^T`` for a frozen base, with its backward written out.

    Autograd's own backward for the same graph is correct but slow on CPU in two places: the gradient of ``B``
    comes out of ``addmm_``'s backward as ``grad^T @ update``, a matmul on a transposed ``[out_dim, n]`` view that
    MKL runs at a tenth of its rate (a 2048 x 1720 x 8 product: 8 ms, against 0.8 ms for ``(update^T @ grad)^T``);
    and the input gradients of the base and the adapter paths are two tensors added afterwards. Here the input
    gradient of the adapter path accumulates into the base's in one ``addmm_`` when there is no dropout
    (``dropped`` None). Saved for backward: ``x`` (or ``dropped``) and the ``[n, rank]`` update, as autograd
    would. An NF4 base weight (QLoRA) is dequantised for the input gradient, as torchao's own NF4 linear does.
    """

    @staticmethod
    def forward(ctx, x, dropped, weight, bias, lora_a, lora_b, scaling):
        # x, dropped: [n, in_dim]; weight: [out_dim, in_dim]; lora_a: [rank, in_dim]; lora_b: [out_dim, rank]
        # dropped: the adapter's input after dropout, None without dropout (the same tensor passed twice would
        # stop torch.compile from tracing this function)
        ctx.same_input = dropped is None
        dropped = x if dropped is None else dropped
        out = F.linear(x, weight, bias)  # [n, out_dim]
        update = (dropped @ lora_a.t()).mul_(scaling)  # [n, rank], scaled on the small side
        out.addmm_(update, lora_b.t())
        ctx.quantized = type(weight) not in _PLAIN_TENSOR_TYPES  # NF4; decided here, where dynamo can trace it
        ctx.scaling = scaling
        ctx.save_for_backward(weight, lora_a, lora_b, dropped, update)
        return out

    @staticmethod
    def backward(ctx, grad):
        weight, lora_a, lora_b, dropped, update = ctx.saved_tensors
        dense = dequantize(weight) if ctx.quantized else weight
        needs_x, needs_dropped = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_x = grad_dropped = grad_a = grad_b = None
        # d loss / d (dropped A^T), scaled: [n, rank]
        grad_update = (grad @ lora_b).mul_(ctx.scaling)
        if ctx.needs_input_grad[5]:
            grad_b = (update.t() @ grad).t().contiguous()  # [out_dim, rank], computed the fast way round
        if ctx.needs_input_grad[4]:
            grad_a = grad_update.t() @ dropped  # [rank, in_dim]
        if ctx.same_input:
            if needs_x:
                grad_x = (grad @ dense).addmm_(grad_update, lora_a)  # both paths in one [n, in_dim] tensor
        else:
            if needs_x:
                grad_x = grad @ dense
            if needs_dropped:
                grad_dropped = grad_update @ lora_a
        return grad_x, grad_dropped, None, None, grad_a, grad_b, None


def _quantize_loaded_base_weight(
    module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict, *args
) -> None:
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


def _check_lora_args(in_dim: int, out_dim: int, rank: int, dropout: float) -> None:
    if in_dim <= 0 or out_dim <= 0:
        raise ValueError(f"in_dim and out_dim must be positive, got in_dim={in_dim}, out_dim={out_dim}.")
    if rank <= 0:
        raise ValueError(f"LoRA rank must be a positive integer, got rank={rank}. Typical values are 8 to 64.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1), got dropout={dropout}.")
