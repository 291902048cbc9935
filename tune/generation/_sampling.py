"""Turning next-token logits into tokens: greedy, temperature, top-k and top-p (nucleus) sampling."""

import torch


def _check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no top-k filtering), got {top_k!r}.")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None (no nucleus filtering), got {top_p}.")


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keeps the ``top_k`` largest logits of each row (ties with the k-th are kept) and sets the rest to -inf.

    Args:
        logits (torch.Tensor): [b, vocab] logits.
        top_k (int): how many to keep; values >= vocab keep everything.

    Returns:
        torch.Tensor: [b, vocab] filtered logits.
    """
    if top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [b, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keeps, per row, the smallest set of most probable tokens whose probabilities add up to at least ``top_p``
    (nucleus sampling, Holtzman et al., 2019, https://arxiv.org/abs/1904.09751) and sets the rest to -inf.

    The most probable token is always kept.

    Args:
        logits (torch.Tensor): [b, vocab] logits (after temperature).
        top_p (float): probability mass to keep, in (0, 1].

    Returns:
        torch.Tensor: [b, vocab] filtered logits.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    # A token is dropped when the tokens ranked before it already hold top_p of the mass.
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: torch.Generator | None = None,
    q: torch.Tensor | None = None,
) -> torch.Tensor:
    """Picks one token per row from next-token logits, as torchtune's ``sample`` does.

    ``temperature == 0`` is greedy (argmax). Otherwise the logits are divided by ``temperature``, filtered by
    top-k and then top-p (the order Hugging Face ``transformers`` applies them in), and a token is drawn from
    the softmax by the exponential race: ``argmax(probs / q)`` with ``q`` Exponential(1) noise is a draw from
    ``probs``. The noise is drawn as torchtune draws it (float32, the logits' shape, from ``rng`` or the global
    generator), so a seed gives the tokens torchtune gives for float32 logits without ``top_p``.

    Args:
        logits (torch.Tensor): [..., vocab] next-token logits, e.g. [b, vocab].
        temperature (float): softmax temperature; 0 for greedy. Default 1.0.
        top_k (int | None): keep only the k most likely tokens. Default None (all).
        top_p (float | None): keep the smallest set of tokens holding this probability mass. Default None (all).
        rng (torch.Generator | None): generator for the noise, on the logits' device. Default None (the global
            generator).
        q (torch.Tensor | None): [..., vocab] Exponential(1) noise supplied by the caller (``rng`` is then
            unused). Default None (drawn here).

    Returns:
        torch.Tensor: [..., 1] int32 token ids, e.g. [b, 1] for [b, vocab] logits.

    Raises:
        ValueError: for a negative temperature, a non-positive top_k, or top_p outside (0, 1].
    """
    _check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True).int()
    scaled = logits.float() / temperature
    if top_k is not None:
        scaled = apply_top_k(scaled, top_k)
    if top_p is not None:
        scaled = apply_top_p(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    if q is None:
        q = torch.empty_like(probs).exponential_(1, generator=rng)
    return (probs / q.reshape(probs.shape)).argmax(dim=-1, keepdim=True).int()
