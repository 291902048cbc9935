"""LoRA with quantisation-aware training of the base layer, through torchao's fake quantisation."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft._lora import LoRALinear
from tune.utils import import_optional

__all__ = ["QATLoRALinear"]


def _fake_quantizer(config: Any, what: str) -> nn.Module:
    """A torchao fake quantiser for ``config`` (a ``FakeQuantizeConfigBase``), or the identity for None."""
    if config is None:
        return nn.Identity()
    qat = import_optional("torchao.quantization.qat", "QATLoRALinear")
    if not isinstance(config, qat.FakeQuantizeConfigBase):
        raise TypeError(
            f"{what} must be a torchao fake-quantize config (e.g. torchao.quantization.qat.IntxFakeQuantizeConfig); "
            f"received {type(config).__name__}."
        )
    return qat.FakeQuantizerBase.from_config(config)


class QATLoRALinear(LoRALinear):
    """:class:`LoRALinear` whose base layer sees fake-quantised activations and weight (QAT + LoRA).

    ``y = F.linear(fq_act(x), fq_weight(W)) + (alpha / rank) * B(A(dropout(x)))``: the frozen base weight and the
    input of the base matmul are rounded to the quantised grid in the forward pass (gradients pass straight
    through), so the adapters learn to correct for the error a quantised deployment will have. The adapter path
    stays in full precision. No bias and no NF4 base (``use_bias=False``, ``quantize_base=False``).

    Args:
        in_dim (int): input features.
        out_dim (int): output features.
        rank (int): rank of the update.
        alpha (float): scale numerator of the update.
        dropout (float): dropout on the adapter's input. Default 0.0.
        activation_qat_config (FakeQuantizeConfigBase | None): torchao config for the activations; None leaves them
            unquantised. Default None.
        weight_qat_config (FakeQuantizeConfigBase | None): torchao config for the base weight; None leaves it
            unquantised. Default None.

    Raises:
        TypeError: if a config is not a torchao fake-quantize config.
        ValueError: if the weight config's ``group_size`` does not divide ``in_dim``, or for bad LoRA sizes.
        ImportError: if torchao is not installed.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        activation_qat_config: Any = None,
        weight_qat_config: Any = None,
    ) -> None:
        super().__init__(in_dim, out_dim, rank, alpha, dropout, use_bias=False, quantize_base=False)
        group_size = getattr(weight_qat_config, "group_size", None)
        if group_size is not None and in_dim % group_size != 0:
            raise ValueError(f"in_dim ({in_dim}) must be a multiple of the weight config's group_size ({group_size}).")
        self.activation_fake_quantizer = _fake_quantizer(activation_qat_config, "activation_qat_config")
        self.weight_fake_quantizer = _fake_quantizer(weight_qat_config, "weight_qat_config")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_dim] -> [..., out_dim]``: the fake-quantised base layer plus the full-precision update."""
        base = F.linear(self.activation_fake_quantizer(x), self.weight_fake_quantizer(self.weight))
        if self.disabled:
            return base
        return base + self.lora_b(self.lora_a(self.dropout(x))) * self.scaling

    @classmethod
    def from_lora_linear(
        cls,
        lora_linear: LoRALinear,
        activation_qat_config: Any = None,
        weight_qat_config: Any = None,
    ) -> "QATLoRALinear":
        """A ``QATLoRALinear`` sharing the base weight and adapters of ``lora_linear``.

        Args:
            lora_linear (LoRALinear): a layer without bias and without an NF4 base.
            activation_qat_config (FakeQuantizeConfigBase | None): as in the constructor.
            weight_qat_config (FakeQuantizeConfigBase | None): as in the constructor.

        Returns:
            QATLoRALinear: the new layer (its parameters are ``lora_linear``'s, not copies).

        Raises:
            ValueError: if ``lora_linear`` has a bias or an NF4 base weight.
        """
        if lora_linear.bias is not None or lora_linear._quantize_base:
            raise ValueError("QATLoRALinear supports LoRA layers without bias and without an NF4 base weight only.")
        dropout = lora_linear.dropout.p if isinstance(lora_linear.dropout, nn.Dropout) else 0.0
        layer = cls(
            lora_linear.in_dim,
            lora_linear.out_dim,
            lora_linear.rank,
            lora_linear.alpha,
            dropout,
            activation_qat_config,
            weight_qat_config,
        )
        layer.weight = lora_linear.weight
        layer.lora_a.weight = lora_linear.lora_a.weight
        layer.lora_b.weight = lora_linear.lora_b.weight
        return layer
