"""torchtune's ``training.quantization`` module: the quantizer-mode names and torchao's quantizers.

torchao is optional (``pip install 'tune[torchao]'``): the quantizer classes are imported from it on first use.
tune's own QAT-with-LoRA path is :class:`tune.training.Int8DynActInt4WeightQATConverter`.
"""

import importlib
from collections.abc import Callable
from typing import Any

from tune.utils import import_optional

# class name -> torchtune's mode string; by name so that knowing a quantizer does not import torchao
_MODES = {
    "Int8DynActInt4WeightQuantizer": "8da4w",
    "Int8DynActInt4WeightQATQuantizer": "8da4w-qat",
    "Int4WeightOnlyQuantizer": "4w",
    "Int4WeightOnlyQATQuantizer": "4w-qat",
    "Int4WeightOnlyQATQuantizerModuleSwap": "4w-qat-module-swap",
    "Int8DynActInt4WeightQATQuantizerModuleSwap": "8da4w-qat-module-swap",
    "Int8DynActInt4WeightQATConverter": "8da4w-qat",
}

# torchtune re-exports these from torchao
_TORCHAO_QUANTIZERS = {
    "Int8DynActInt4WeightQuantizer": "torchao.quantization",
    "Int4WeightOnlyQuantizer": "torchao.quantization",
    "Int8DynActInt4WeightQATQuantizer": "torchao.quantization.qat",
    "Int4WeightOnlyQATQuantizer": "torchao.quantization.qat",
}

__all__ = ["get_quantizer_mode", *_TORCHAO_QUANTIZERS]


def get_quantizer_mode(quantizer: Callable | None) -> str | None:
    """torchtune's short name for a quantizer, used in file names and to pick the matching fake-quant toggles.

    ``"8da4w"`` (int8 dynamic activations, int4 weights), ``"4w"`` (int4 weight-only), their QAT forms
    (``"8da4w-qat"``, ``"4w-qat"``) and module-swap forms.

    Args:
        quantizer (Callable | None): a quantizer object (torchao's, or tune's QAT converter).

    Returns:
        str | None: the mode, or None for a quantizer (or None) it does not know.
    """
    return _MODES.get(type(quantizer).__name__) if quantizer is not None else None


def __getattr__(name: str) -> Any:
    if name in _TORCHAO_QUANTIZERS:
        import_optional("torchao", f"tune.training.quantization.{name}")  # names the extra when missing
        return getattr(importlib.import_module(_TORCHAO_QUANTIZERS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
