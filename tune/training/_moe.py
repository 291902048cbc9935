"""The load-balancing loss of mixture-of-experts models in the SFT recipes, written once for all of them.

A recipe's ``loss_step`` returns the SUM of its micro-batch's token losses, and the loop multiplies every sum by
``world_size / N`` (``N``: the loss tokens of the whole step on all ranks). The router loss is a per-batch
quantity, not a per-token one, so it enters that sum weighted by the micro-batch's own loss tokens ``n``::

    loss_step = sum of token losses + coef * aux * n

After the loop's scaling (and FSDP's gradient averaging over ranks) the step minimises

    (sum of token losses) / N + coef * sum_micro_batches(n * aux) / N

that is the step's mean token loss plus ``coef`` times the token-weighted mean of the micro-batches' router
losses. With one micro-batch on one device this is exactly transformers' ``Qwen3MoeForCausalLM``: its mean
cross-entropy plus ``router_aux_loss_coef * aux_loss``. With gradient accumulation or data parallelism each
micro-batch's router loss is computed over that micro-batch's tokens (as each of transformers' forward passes
would), so 2 ranks of 1 micro-batch equal 1 device accumulating the same 2 micro-batches.
"""

from typing import Any

import torch
from torch import nn

from tune.modules.moe import load_balancing_loss, moe_layers
from tune.training._loss_scaling import num_loss_tokens
from tune.utils import get_logger

log = get_logger(name="tune.training")


class RouterAuxLoss:
    """Adds the Switch-style load-balancing loss of a mixture-of-experts model to a recipe's summed loss, and
    returns it and two routing statistics as metrics. A model without MoE blocks is left alone (no metric).

    Build it once the model exists (after sharding or compiling: it keeps the model's
    :class:`~tune.modules.moe.MoE` blocks); call it in ``loss_step`` after the forward pass. The loss is computed
    over the forward pass's real tokens (``tokens != pad_id``), pooled over all MoE layers
    (:func:`tune.modules.moe.load_balancing_loss`), and added (weighted as the module docstring says) only while
    the model is in training mode and ``coef > 0``: validation losses stay plain token losses. With
    ``coef == 0`` it is still computed, without a graph, for the metric.

    Metrics, all tensors on the model's device (read only at logging steps, so no host sync in the step):

    - ``router_aux_loss``: the micro-batch's load-balancing loss (``experts_per_token`` when perfectly balanced);
    - ``expert_load_max`` / ``expert_load_min``: over all MoE layers, the most and least loaded expert's token
      slots relative to an even share (1.0 and 1.0 when balanced; a min of 0 means an expert received nothing).
      Padding tokens are counted here (:func:`tune.modules.moe.tokens_per_expert`).

    Args:
        model (nn.Module): the model the recipe trains.
        coef (float): weight of the router loss (transformers' ``router_aux_loss_coef``; Qwen3-MoE's config.json
            has 0.001). 0 logs it without training on it.
        pad_id (int | None): the tokenizer's padding id; None when batches hold no padding.
        ignore_idx (int): the label of tokens without a loss. Default -100.

    Raises:
        ValueError: for a negative or non-finite ``coef``.
    """

    def __init__(self, model: nn.Module, coef: float, pad_id: int | None, ignore_idx: int = -100) -> None:
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0.0 <= coef < float("inf"):
            raise ValueError(f"router_aux_loss_coef must be a number >= 0, got {coef!r}.")
        self._model = model
        self._layers = moe_layers(model)
        self.coef = float(coef)
        self._pad_id = pad_id
        self._ignore_idx = ignore_idx
        if self._layers:
            router = self._layers[0].router
            self._num_experts, self._experts_per_token = router.num_experts, router.experts_per_token
            action = f"added with weight {self.coef}" if self.coef > 0 else "logged only (router_aux_loss_coef: 0)"
            log.info("Mixture of experts: %d MoE layers; the load-balancing loss is %s.", len(self._layers), action)
        elif self.coef > 0:
            log.warning("router_aux_loss_coef=%s has no effect: the model has no mixture-of-experts layer.", coef)

    @property
    def enabled(self) -> bool:
        """Whether the model has MoE blocks (and so whether any metric is returned)."""
        return bool(self._layers)

    def __call__(
        self, loss_sum: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The micro-batch's summed loss with the router term, and the routing metrics.

        Args:
            loss_sum (torch.Tensor): the summed token losses of the micro-batch (0-d).
            tokens (torch.Tensor): the input tokens ``[b, s]`` of the forward pass just run.
            labels (torch.Tensor): the shifted labels ``[b, s]`` the loss read (``ignore_idx`` for no loss).

        Returns:
            tuple[torch.Tensor, dict[str, Any]]: ``loss_sum`` (plus ``coef * aux * n`` while training), and the
            metrics (empty for a model without MoE blocks).
        """
        if not self._layers:
            return loss_sum, {}
        padding_mask = None if self._pad_id is None else tokens != self._pad_id
        train_on_it = self.coef > 0 and self._model.training
        with torch.set_grad_enabled(train_on_it and torch.is_grad_enabled()):
            logits = [layer.router_logits for layer in self._layers]
            if any(x is None for x in logits):
                raise RuntimeError("RouterAuxLoss is called after the model's forward pass (no router logits yet).")
            aux = load_balancing_loss(logits, self._num_experts, self._experts_per_token, padding_mask)
        if train_on_it:
            num_tokens = num_loss_tokens(labels, self._ignore_idx).to(aux.dtype)  # on the device: no host sync
            loss_sum = loss_sum + (self.coef * aux * num_tokens).to(loss_sum.dtype)
        metrics = {"router_aux_loss": aux.detach(), **self._load_stats()}
        return loss_sum, metrics

    @torch.no_grad()
    def _load_stats(self) -> dict[str, torch.Tensor]:
        counts = torch.stack([layer.tokens_per_expert for layer in self._layers]).float()  # [layers, experts]
        share = counts / counts.mean(dim=-1, keepdim=True).clamp(min=1.0)
        return {"expert_load_max": share.max(), "expert_load_min": share.min()}
