"""torchtune's quantizer-mode names and the torchao quantizers under torchtune's module path."""

import pytest

from tune.training import Int8DynActInt4WeightQATConverter, get_quantizer_mode


def test_quantizer_modes():
    quantization = pytest.importorskip("tune.training.quantization")
    pytest.importorskip("torchao")
    assert get_quantizer_mode(quantization.Int8DynActInt4WeightQATQuantizer()) == "8da4w-qat"
    assert get_quantizer_mode(quantization.Int4WeightOnlyQuantizer()) == "4w"
    assert get_quantizer_mode(Int8DynActInt4WeightQATConverter()) == "8da4w-qat"
    assert get_quantizer_mode(object()) is None and get_quantizer_mode(None) is None
