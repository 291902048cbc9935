"""The mixture-of-experts feed-forward block and its load-balancing loss.

``MoE`` replaces a transformer layer's feed-forward network: a router picks k experts per token, the experts'
outputs are mixed with the router's weights, and an optional shared expert sees every token. Each call keeps
the router logits and the number of token slots per expert of that forward pass (``router_logits``,
``tokens_per_expert``), so that a training loop can add the load-balancing loss (:func:`moe_aux_loss`) and log
the routing without the model returning anything but logits.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.moe._experts import SwiGLUExperts, count_per_expert
from tune.modules.moe._router import TopKRouter


class MoE(nn.Module):
    """A sparse mixture-of-experts feed-forward block (token-choice top-k routing, no token dropping).

    ``y = sum_j w_j * expert_{i_j}(x) (+ shared_expert(x))`` over the k experts ``i_j`` the router picks for token
    ``x`` with weights ``w_j``. Every token is processed by all k of its experts: there is no capacity factor and
    no token is dropped, whatever the load of an expert.

    After each forward pass, ``router_logits`` holds that pass's router logits ``[num_tokens, num_experts]``
    (with their graph, for the auxiliary loss) and ``tokens_per_expert`` the number of token slots each expert
    received (``[num_experts]``, detached; padding included). :func:`moe_aux_loss` reads them.

    Args:
        experts (SwiGLUExperts): the routed experts (or a LoRA variant).
        router (TopKRouter): picks the experts.
        shared_expert (nn.Module | None): a feed-forward network applied to every token and added (Llama 4);
            None for none (Qwen3-MoE). Default None.
    """

    def __init__(self, *, experts: SwiGLUExperts, router: TopKRouter, shared_expert: nn.Module | None = None) -> None:
        super().__init__()
        if experts.num_experts != router.num_experts:
            raise ValueError(f"router has {router.num_experts} experts but experts has {experts.num_experts}.")
        self.experts = experts
        self.router = router
        self.shared_expert = shared_expert
        self.router_logits: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., dim] -> [..., dim]."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits, weights, indices = self.router(tokens)
        out = self.experts(tokens, weights, indices)
        if self.shared_expert is not None:
            out = out + self.shared_expert(tokens)
        self.router_logits = logits
        with torch.no_grad():
            self.tokens_per_expert = count_per_expert(indices, self.router.num_experts)
        return out.reshape(shape)


def moe_layer_pattern(num_layers: int, decoder_sparse_step: int = 1, mlp_only_layers: Sequence[int] = ()) -> list[bool]:
    """Which layers are MoE (True) and which dense (False), in Qwen-MoE's terms.

    Layer ``i`` is MoE when ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in ``mlp_only_layers``
    (Qwen3-MoE's ``config.json``: step 1 and no dense layers, so every layer is MoE).

    Args:
        num_layers (int): transformer layers.
        decoder_sparse_step (int): every this many layers is sparse. Default 1.
        mlp_only_layers (Sequence[int]): layers forced dense. Default none.

    Returns:
        list[bool]: one entry per layer.

    Raises:
        ValueError: for a step below 1 or a dense-layer index outside the model.
    """
    if decoder_sparse_step < 1:
        raise ValueError(f"decoder_sparse_step must be >= 1, got {decoder_sparse_step}.")
    outside = sorted(i for i in mlp_only_layers if not 0 <= i < num_layers)
    if outside:
        raise ValueError(f"mlp_only_layers {outside} are outside the model's {num_layers} layers.")
    dense = set(mlp_only_layers)
    return [(i + 1) % decoder_sparse_step == 0 and i not in dense for i in range(num_layers)]


def load_balancing_loss(
    router_logits: torch.Tensor | Sequence[torch.Tensor],
    num_experts: int,
    experts_per_token: int,
    padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Switch Transformer load-balancing loss (Fedus et al., 2021, https://arxiv.org/abs/2101.03961, eq. 4-6).

    ``E * sum_i f_i * P_i`` where ``f_i`` is the number of top-k slots routed to expert ``i`` per token and
    ``P_i`` the mean router probability of expert ``i``. With several layers, the counts and probabilities are
    pooled over all layers before the product (as transformers' ``load_balancing_loss_func`` does for Qwen-MoE
    and Mixtral), so the loss is that of the whole model's routing, not a sum of per-layer losses. It is ``k``
    for perfectly uniform routing (``f_i = k / E``, ``P_i = 1 / E``).

    Args:
        router_logits (torch.Tensor | Sequence[torch.Tensor]): ``[num_tokens, num_experts]`` per MoE layer.
        num_experts (int): E.
        experts_per_token (int): k, as the router used.
        padding_mask (torch.Tensor | None): ``[batch, seq]`` (or ``[num_tokens]``), True/1 for real tokens, in
            the row order of the logits; padding tokens are left out of both ``f`` and ``P``. Default None.

    Returns:
        torch.Tensor: a float32 scalar.

    Raises:
        ValueError: without logits, or a mask whose size is not the number of tokens.
    """
    if isinstance(router_logits, torch.Tensor):
        router_logits = [router_logits]
    if not router_logits:
        raise ValueError("load_balancing_loss needs the router logits of at least one MoE layer.")
    device = router_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs_sum = torch.zeros(num_experts, dtype=torch.float32, device=device)
    num_tokens = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        probs = F.softmax(logits.float(), dim=-1)
        chosen = torch.topk(probs, experts_per_token, dim=-1).indices  # [num_tokens, k]
        if padding_mask is None:
            keep = torch.ones(probs.shape[0], dtype=torch.float32, device=device)
        else:
            keep = padding_mask.reshape(-1).to(device=device, dtype=torch.float32)
            if keep.numel() != probs.shape[0]:
                raise ValueError(f"padding_mask has {keep.numel()} entries for {probs.shape[0]} routed tokens.")
        slot_keep = keep.unsqueeze(-1).expand_as(chosen).reshape(-1)
        counts = counts + torch.zeros_like(counts).scatter_add_(0, chosen.reshape(-1), slot_keep)
        probs_sum = probs_sum + (probs * keep.unsqueeze(-1)).sum(dim=0)
        num_tokens = num_tokens + keep.sum()
    return num_experts * torch.sum((counts / num_tokens) * (probs_sum / num_tokens))


def moe_layers(model: nn.Module) -> list[MoE]:
    """The :class:`MoE` blocks of ``model``, in module order."""
    return [module for module in model.modules() if isinstance(module, MoE)]


def moe_aux_loss(model: nn.Module, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The load-balancing loss of ``model``'s last forward pass, over all its MoE blocks.

    Call it after the forward pass and before the next one; add ``coef * moe_aux_loss(model, mask)`` to the
    training loss (Qwen3-MoE's ``router_aux_loss_coef`` is 0.001). See :func:`load_balancing_loss`.

    Args:
        model (nn.Module): a model containing :class:`MoE` blocks that has run a forward pass.
        padding_mask (torch.Tensor | None): ``[batch, seq]``, True for real tokens. Default None (all count).

    Returns:
        torch.Tensor: a float32 scalar.

    Raises:
        ValueError: if the model has no MoE block, or no forward pass was run.
    """
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE block: there is no load-balancing loss to compute.")
    if any(layer.router_logits is None for layer in layers):
        raise ValueError("moe_aux_loss needs a forward pass of the model first (no router logits recorded).")
    router = layers[0].router
    logits = [layer.router_logits for layer in layers]
    return load_balancing_loss(logits, router.num_experts, router.experts_per_token, padding_mask)


def tokens_per_expert(model: nn.Module) -> torch.Tensor:
    """Token slots each expert received in the last forward pass, one row per MoE block (for logging).

    Returns:
        torch.Tensor: ``[num_moe_layers, num_experts]`` int64 counts (padding tokens included).

    Raises:
        ValueError: if the model has no MoE block or has not run a forward pass.
    """
    layers = moe_layers(model)
    if not layers or any(layer.tokens_per_expert is None for layer in layers):
        raise ValueError("tokens_per_expert needs a model with MoE blocks that has run a forward pass.")
    return torch.stack([layer.tokens_per_expert for layer in layers])
