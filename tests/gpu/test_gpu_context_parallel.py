"""Context-parallel attention on the tier's device: a rank's two chunks attending the whole sequence.

On CUDA the blocks run through the memory-efficient SDPA kernel and its backward (``_context_parallel``'s
``_block_forward`` / ``_block_backward``), a path the CPU suite never takes (it uses the CPU flash kernel); the
check is the one of tests/tune/modules/test_context_parallel_attention.py, on the device: outputs and q/k/v
gradients against causal SDPA over the whole sequence in fp32, every rank of 2- and 3-rank layouts, grouped-query
heads.
"""

import pytest
import torch

from tests.gpu._checks import DEVICE, record
from tests.tune.modules.test_context_parallel_attention import check_rank_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "dtype,atol",
    [
        (torch.float32, 1e-4),  # fp32 on both sides, other kernels: rounding only
        (torch.bfloat16, 0.1),  # bf16 inputs against an fp32 reference: 8 significant bits on values of ~1-3
    ],
)
def test_rank_attention_equals_causal_attention_on_the_device(dtype, atol):
    worst = check_rank_attention(DEVICE, dtype, atol=atol)  # also asserts every value and gradient on the way
    record(f"chunked causal attention {dtype} vs fp32 SDPA", worst, float("nan"), f"abs {atol}", worst < atol)
    print(f"{DEVICE} {dtype}: max |chunked - causal SDPA| = {worst:.2e}")
    assert worst < atol, worst
