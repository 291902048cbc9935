"""tune/rlhf/_stats.py: masked statistics against the same statistics of the selected entries."""

import pytest
import torch

from tune.rlhf import masked_mean, masked_var, whiten


def _values():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=gen) > 0.4
    return x, mask


def test_masked_mean_and_var():
    x, mask = _values()
    assert masked_mean(x, mask).item() == pytest.approx(x[mask].mean().item(), abs=1e-7)
    rows = masked_mean(x, mask, dim=1)
    for row in range(3):
        assert rows[row].item() == pytest.approx(x[row][mask[row]].mean().item(), abs=1e-7)
    centred = x - masked_mean(x, mask)
    assert masked_var(centred, mask).item() == pytest.approx(x[mask].var().item(), rel=1e-6)
    assert masked_var(centred, mask, unbiased=False).item() == pytest.approx(
        x[mask].var(unbiased=False).item(), rel=1e-6
    )


def test_whiten():
    x, mask = _values()
    out = whiten(x, mask, shift_mean=False)
    assert out[mask].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out[mask].var().item() == pytest.approx(1.0, abs=1e-6)
    shifted = whiten(x, mask)
    torch.testing.assert_close(shifted, out + masked_mean(x, mask))
    plain = whiten(x, shift_mean=False)
    assert plain.mean().item() == pytest.approx(0.0, abs=1e-6) and plain.var().item() == pytest.approx(1.0, abs=1e-6)
