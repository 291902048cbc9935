"""Parameter dtype checks and torchtune's precision module."""

import pytest
import torch
from torch import nn

from tune.training import validate_expected_param_dtype
from tune.training.precision import PRECISION_STR_TO_DTYPE, get_dtype, verify_bf16_support


def test_validate_expected_param_dtype_skips_excluded_names():
    model = nn.Sequential(nn.Linear(2, 2).to(torch.bfloat16), nn.Linear(2, 2))  # "1.*" stays fp32
    with pytest.raises(ValueError, match=r"1.weight \(torch.float32\)"):
        validate_expected_param_dtype(model.named_parameters(), torch.bfloat16)
    validate_expected_param_dtype(model.named_parameters(), torch.bfloat16, exclude_param_names=["1."])


def test_precision_names_and_bf16_support():
    assert all(get_dtype(name) is dtype for name, dtype in PRECISION_STR_TO_DTYPE.items())
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert verify_bf16_support() is False  # as torchtune: a CPU alone does not count
