"""Statistics over masked tensors: the mean, variance and whitening used by policy-gradient methods."""

import torch

_EPS = 1e-8  # keeps an all-masked tensor from dividing by zero


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The mean of the entries of ``x`` where ``mask`` is True (over ``dim``, or over everything).

    Args:
        x (torch.Tensor): values.
        mask (torch.Tensor): bool, broadcastable to ``x``; True where the value counts.
        dim (int | None): the dimension to average over; None: all of them. Default None.

    Returns:
        torch.Tensor: the mean (about 0 where nothing is unmasked).
    """
    return (x * mask).sum(dim=dim) / (mask.sum(dim=dim) + _EPS)


def masked_var(centered_values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """The variance of the unmasked entries of an already mean-centred tensor.

    Args:
        centered_values (torch.Tensor): ``x - masked_mean(x, mask)``.
        mask (torch.Tensor): bool, True where the value counts.
        unbiased (bool): apply Bessel's correction ``n / (n - 1)`` with ``n`` the unmasked count. Default True.

    Returns:
        torch.Tensor: a 0-d variance.
    """
    variance = masked_mean(centered_values.pow(2), mask)
    if unbiased:
        count = mask.sum() + _EPS
        variance = variance * count / (count - 1)
    return variance


def whiten(x: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True) -> torch.Tensor:
    """Scales ``x`` to unit variance (over the unmasked entries when ``mask`` is given).

    Args:
        x (torch.Tensor): values.
        mask (torch.Tensor | None): bool, True where the value counts in the statistics. Default None.
        shift_mean (bool): keep the original mean (True) or centre the result at 0 (False). Default True.

    Returns:
        torch.Tensor: ``(x - mean) / sqrt(var + 1e-8)``, plus ``mean`` when ``shift_mean``.
    """
    if mask is None:
        mean, variance = x.mean(), x.var()
    else:
        mean = masked_mean(x, mask)
        variance = masked_var(x - mean, mask)
    whitened = (x - mean) * torch.rsqrt(variance + _EPS)
    return whitened + mean if shift_mean else whitened
